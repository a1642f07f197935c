"""Training windows of token ids, as llama.cpp's ``common_opt_dataset_init`` cuts a text.

A text is tokenized with BOS as the model says (special tokens not parsed); window ``i`` holds
tokens ``i*stride .. i*stride + n_ctx - 1`` and its labels are the same tokens shifted by one;
``stride = n_ctx // 2`` and there are ``(n_tokens - n_ctx - 1) // stride`` windows (llama.cpp's
count). A label of :data:`MASKED` takes no part in the loss (chat data, :mod:`.chat`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..errors import DTypeError, InvalidValueError, ShapeError
from ..models.llama.vocab import Tokenizer
from ..opt import Dataset
from ..types import I32

__all__ = ["MASKED", "Overflow", "Windows", "text_windows", "tokenize_texts", "split_point",
           "to_dataset"]

#: The label of a position whose prediction is not trained (as PyTorch's ``ignore_index``).
MASKED = -100


@dataclasses.dataclass(frozen=True)
class Overflow:
    """What :func:`chat_windows` did with conversations longer than a window: how many it
    truncated or skipped, and the assistant tokens that did not fit."""

    truncated: int = 0
    skipped: int = 0
    lost_tokens: int = 0

    def line(self, n_ctx: int) -> str:
        """One warning line, or ``""`` when no conversation was too long."""
        if not (self.truncated or self.skipped):
            return ""
        return (f"warning: chat data: {self.truncated} conversation(s) truncated and "
                f"{self.skipped} skipped at --ctx {n_ctx}; {self.lost_tokens} assistant "
                f"token(s) left out of the loss")


@dataclasses.dataclass
class Windows:
    """``tokens`` and ``labels``, both int32 ``(n, n_ctx)``; a label :data:`MASKED` is left
    out of the loss; ``overflow``: the conversations longer than a window (chat data);
    ``segments`` (packed chat windows, else None): per position the index of its conversation
    in the window, -1 for the padding (:func:`ggopt.models.llama.set_segments`); ``lengths``
    (chat windows, else None: all real): the real tokens per window, the padding left out."""

    tokens: np.ndarray
    labels: np.ndarray
    overflow: Overflow = dataclasses.field(default_factory=Overflow)
    segments: np.ndarray | None = None
    lengths: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "labels", "segments", "lengths"):
            a = getattr(self, name)
            if a is None and name in ("segments", "lengths"):
                continue
            if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
                raise DTypeError(f"windows: {name} must be an integer NumPy array, got "
                                 f"{getattr(a, 'dtype', type(a).__name__)}")
        if self.tokens.ndim != 2 or self.tokens.shape != self.labels.shape or (
                self.segments is not None and self.segments.shape != self.tokens.shape):
            raise ShapeError(f"windows: tokens, labels (and segments) must all be (n, n_ctx), "
                             f"got {self.tokens.shape} and {self.labels.shape}")
        if self.lengths is not None and self.lengths.shape != self.tokens.shape[:1]:
            raise ShapeError(f"windows: lengths must be ({len(self.tokens)},), got "
                             f"{self.lengths.shape}")

    @property
    def packed(self) -> bool:
        """Several conversations per window (``segments`` set)."""
        return self.segments is not None

    def real_tokens(self, rows: Sequence[int] | np.ndarray | None = None) -> int:
        """The real (not padding) tokens of windows ``rows`` (default: all)."""
        idx = np.arange(len(self)) if rows is None else np.asarray(rows, np.int64)
        if self.lengths is None:
            return len(idx) * self.n_ctx
        return int(self.lengths[idx].sum())

    def check_vocab(self, n_vocab: int, where: str) -> None:
        """InvalidValueError unless every token and every label (but MASKED) is an id below
        ``n_vocab`` (a label of -5 picked the fifth-last id, one of ``n_vocab`` an IndexError)."""
        for what, ids, allowed in (("token", self.tokens, None), ("label", self.labels, MASKED)):
            bad = (ids < 0) | (ids >= n_vocab)
            if allowed is not None:
                bad &= ids != allowed
            if bad.any():
                w, i = (int(k) for k in np.argwhere(bad)[0])
                raise InvalidValueError(
                    f"{where}: {what} {int(ids[w, i])} at position {i} of window {w} is "
                    f"outside the model's vocabulary of {n_vocab} tokens"
                    + ("" if allowed is None else f" (and not MASKED, {MASKED})"))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_ctx(self) -> int:
        return int(self.tokens.shape[1])

    def n_trained(self) -> int:
        """How many positions carry a label (the tokens the loss is over)."""
        return int(np.count_nonzero(self.labels != MASKED))


def tokenize_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
    """The token ids of each text (BOS as the model says, special tokens not parsed, as
    llama.cpp's ``common_tokenize(ctx, text, true)``), concatenated."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text, add_special=True, parse_special=False))
    return ids


def text_windows(ids: Sequence[int], n_ctx: int, stride: int | None = None) -> Windows:
    """llama.cpp's windows of ``n_ctx`` tokens every ``stride`` (default ``n_ctx // 2``, as
    llama.cpp cuts them).

    Raises
    ------
    ShapeError
        ``n_ctx`` below 2, ``stride`` below 1, or fewer tokens than one window needs
        (llama.cpp underflows there).
    """
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 2:
        raise ShapeError(f"text windows: the context must be an int >= 2, got {n_ctx!r}")
    if stride is None:
        stride = n_ctx // 2
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ShapeError(f"text windows: the stride must be an int >= 1, got {stride!r}")
    need = n_ctx + stride + 1
    if len(ids) < need:
        raise ShapeError(f"text windows: the text has {len(ids)} tokens; one window of "
                         f"{n_ctx} tokens (every {stride}) needs at least {need}")
    arr = np.asarray(ids, np.int32)
    n = (len(arr) - n_ctx - 1) // stride
    starts = np.arange(n)[:, None] * stride + np.arange(n_ctx)[None, :]
    return Windows(arr[starts], arr[starts + 1])


def split_point(n: int, val_split: float) -> int:
    """How many of ``n`` windows train, the rest held out: llama.cpp's
    ``ndata * (1.0f - val_split)`` in float32, truncated.

    Raises
    ------
    ShapeError
        ``val_split`` outside ``[0, 1)``, or no window left for training.
    """
    if not 0.0 <= val_split < 1.0:
        raise ShapeError(f"val split: expected a fraction in [0, 1), got {val_split}")
    ntrain = int(np.float32(n) * (np.float32(1.0) - np.float32(val_split)))
    if ntrain < 1:
        raise ShapeError(f"val split: {n} windows leave none for training at val split "
                         f"{val_split}")
    return ntrain


def to_dataset(windows: Windows) -> Dataset:
    """An :class:`~ggopt.opt.Dataset` of the windows: I32 tokens and I32 labels."""
    n, n_ctx = windows.tokens.shape
    ds = Dataset(I32, I32, n_ctx, n_ctx, n, 1)
    ds.data.numpy()[...] = windows.tokens
    labels = ds.labels
    assert labels is not None  # made with ne_label = n_ctx
    labels.numpy()[...] = windows.labels
    return ds
