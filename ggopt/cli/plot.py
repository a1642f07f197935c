"""Learning curves of a :class:`ggopt.opt.FitHistory` as a PNG (needs the ``plot`` extra)."""

from __future__ import annotations

import os
from types import ModuleType

from ..io.atomic import atomic_path
from ..opt import FitHistory

__all__ = ["require_matplotlib", "plot_history"]


def require_matplotlib() -> ModuleType:
    """Import and return ``matplotlib.figure``; ImportError saying how to install it if absent."""
    try:
        from matplotlib import figure
    except ImportError as exc:
        raise ImportError(
            f"plotting needs matplotlib, which could not be imported ({exc}); install it with "
            "pip install 'ggopt[plot]'"
        ) from None
    return figure


def plot_history(history: FitHistory, path: str | os.PathLike[str], title: str = "") -> None:
    """Write train/validation loss and accuracy per epoch, with their uncertainties, to ``path``.

    Uses matplotlib's object API (no pyplot, no GUI backend).
    """
    figure = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    epochs = range(1, len(history) + 1)
    fig = figure.Figure(figsize=(10, 4), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    for part, style in (("train", "o-"), ("val", "s--")):
        loss, loss_unc = getattr(history, f"{part}_loss"), getattr(history, f"{part}_loss_unc")
        acc, acc_unc = getattr(history, f"{part}_acc"), getattr(history, f"{part}_acc_unc")
        ax_loss.errorbar(epochs, loss, yerr=loss_unc, fmt=style, ms=3, capsize=2, label=part)
        ax_acc.errorbar(epochs, [100 * a for a in acc], yerr=[100 * u for u in acc_unc],
                        fmt=style, ms=3, capsize=2, label=part)
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy loss", yscale="log")
    ax_acc.set(xlabel="epoch", ylabel="accuracy [%]")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    if title:
        fig.suptitle(title)
    fmt = os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format=fmt)
