"""Command-line options for long runs, shared by the training commands.

``--checkpoint FILE`` and ``--resume`` (``--resume-force``) map to :func:`ggopt.opt.fit`'s
``checkpoint`` and ``resume`` (``resume="force"``, see :func:`resume_mode`); ``--lr``,
``--lr-min``, ``--decay-epochs`` and ``--warmup`` pick a learning-rate schedule from
:mod:`ggopt.opt.schedule`:

- neither ``--decay-epochs`` nor ``--warmup``: a constant ``--lr``;
- ``--decay-epochs D``: llama.cpp finetune's ``max(lr_min, lr * 0.5**(epoch/D))``;
- ``--warmup N``: ``N`` optimizer steps of linear warm-up, then cosine decay to ``--lr-min``
  at the last step of the run.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Literal

from ..errors import GgoptError
from ..io.paths import PathLike, check_output_path
from ..opt import OptimizerParams
from ..opt.checks import check_float32
from ..opt.schedule import Schedule, constant, epoch_decay, warmup_cosine

__all__ = ["add_training_args", "check_training_args", "make_schedule", "resume_mode",
           "DEFAULT_LR", "positive_float32", "nonnegative_float32", "unit_float32",
           "check_output_paths"]

DEFAULT_LR = 1e-3  # ggml's default AdamW and SGD alpha


def _float32(text: str, positive: bool, high: float = math.inf) -> float:
    """``text`` as a number checked in float32, the optimizer's type (argparse names the
    option in its message)."""
    kind = "a positive number" if positive else "a number >= 0"
    if high < math.inf:
        kind += f" and <= {high:g}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
    try:
        return check_float32(value, "the value", "", low=0.0, high=high, low_open=positive)
    except GgoptError as exc:
        raise argparse.ArgumentTypeError(f"expected {kind}: {exc}") from None


def positive_float32(text: str) -> float:
    """argparse type: a number > 0, finite and not flushed to zero in float32."""
    return _float32(text, positive=True)


def nonnegative_float32(text: str) -> float:
    """argparse type: a number >= 0, finite and not flushed to zero in float32."""
    return _float32(text, positive=False)


def unit_float32(text: str) -> float:
    """argparse type: a number in [0, 1] in float32 (weight decay)."""
    return _float32(text, positive=False, high=1.0)


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def add_training_args(p: argparse.ArgumentParser, default_lr: float | None = DEFAULT_LR,
                      lr_help: str | None = None) -> None:
    """Add ``--checkpoint``, ``--resume``, ``--lr`` (default ``default_lr``; None: the caller
    chooses after parsing, and ``lr_help`` says how), ``--lr-min``, ``--decay-epochs``,
    ``--warmup`` to a ``train`` sub-command's parser."""
    g = p.add_argument_group("checkpoints and learning-rate schedule")
    g.add_argument("--checkpoint", metavar="FILE",
                   help="save the whole training state (weights, optimizer moments, data "
                        "order, schedule) to FILE after every epoch (GGUF, written atomically; "
                        "default: none)")
    g.add_argument("--resume", action="store_true",
                   help="continue the run saved in --checkpoint FILE after its last epoch; "
                        "the result is bit for bit that of an uninterrupted run; refused when "
                        "the checkpoint was saved by a different run (data, batch, split)")
    g.add_argument("--resume-force", action="store_true",
                   help="--resume even when the checkpoint was saved by a different run "
                        "(other text/data, batch or split): the result is no longer bit-exact")
    g.add_argument("--lr", type=positive_float32, default=default_lr, metavar="LR",
                   help=lr_help or f"learning rate (peak rate with a schedule; default "
                                   f"{default_lr:g})")
    g.add_argument("--lr-min", type=nonnegative_float32, metavar="LR",
                   help="floor of --decay-epochs / end point of the cosine after --warmup "
                        "(default 0)")
    g.add_argument("--decay-epochs", type=positive_float32, metavar="E",
                   help="halve the learning rate every E epochs (llama.cpp finetune's decay; "
                        "default: a constant rate)")
    g.add_argument("--warmup", type=_nonnegative_int, metavar="STEPS",
                   help="linear warm-up over STEPS optimizer steps, then cosine decay to "
                        "--lr-min over the rest of the run (default: a constant rate)")


def check_training_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error on contradictory options (``parser.error``)."""
    if (args.resume or args.resume_force) and not args.checkpoint:
        parser.error("--resume needs --checkpoint FILE")
    if args.decay_epochs is not None and args.warmup is not None:
        parser.error("--decay-epochs and --warmup are different schedules; pick one")
    if args.lr_min is not None:
        if args.decay_epochs is None and args.warmup is None:
            parser.error("--lr-min needs --decay-epochs or --warmup")
        if args.lr_min >= args.lr:
            parser.error(f"--lr-min ({args.lr_min:g}) must be below --lr ({args.lr:g})")


def resume_mode(args: argparse.Namespace) -> bool | Literal["force"]:
    """``fit``'s ``resume`` for ``--resume`` / ``--resume-force``."""
    return "force" if args.resume_force else bool(args.resume)


def check_output_paths(outputs: Sequence[tuple[str, PathLike | None]],
                       inputs: Sequence[tuple[str, PathLike]] = ()) -> None:
    """Before any work: every given output path (``(option, path)``, None skipped) can be
    written (:func:`ggopt.io.paths.check_output_path`) and names none of the ``inputs`` nor
    another output. Raises InvalidValueError (or DTypeError) naming the option."""
    given = [(option, path) for option, path in outputs if path is not None]
    for i, (option, path) in enumerate(given):
        check_output_path(path, option, [*inputs, *given[:i], *given[i + 1:]])


def make_schedule(args: argparse.Namespace, nepoch: int, steps_per_epoch: int,
                  base: OptimizerParams | None = None) -> Schedule:
    """The schedule the options describe, for a run of ``nepoch`` epochs of
    ``steps_per_epoch`` optimizer steps; ``base`` supplies the other hyperparameters.

    Raises InvalidValueError (before any training) when a rate of the run is not a usable
    float32, e.g. ``--decay-epochs`` so short that the rate reaches 0."""
    lr_min = args.lr_min or 0.0
    schedule: Schedule
    if args.decay_epochs is not None:
        schedule = epoch_decay(args.lr, args.decay_epochs, lr_min, base)
    elif args.warmup is not None:
        schedule = warmup_cosine(args.lr, nepoch * steps_per_epoch, args.warmup, lr_min, base)
    else:
        schedule = constant(args.lr, base)
    schedule.check_run(nepoch, steps_per_epoch, "--lr, --lr-min, --decay-epochs, --warmup")
    return schedule
