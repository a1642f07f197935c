"""Prompt/completion data (TRL's format): JSON lines ``{"prompt": "...", "completion": "..."}``,
the loss on the completion only. No chat template: the prompt is tokenized with BOS as the
model says, the completion after it without, then EOS (when the vocabulary has one), trained
too, so the model learns to stop. One pair fills one window, padded with EOS (masked), as chat
data does (:mod:`.chat`). :func:`data_format` tells a file of pairs from chat ``messages``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidValueError, OutOfMemoryError, ShapeError
from ..io.paths import text_path
from ..models.llama.vocab import Tokenizer
from .windows import MASKED, Windows

__all__ = ["data_format", "read_completions", "completion_windows"]


def _lines(path: str | os.PathLike[str], where: str) -> list[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidValueError(f"{where}: cannot read: {exc}") from None


def data_format(path: str | os.PathLike[str]) -> str:
    """``"completion"`` when the file's first record holds a ``prompt``, else ``"messages"``
    (what :func:`ggopt.lm.chat.read_conversations` reads and checks)."""
    where = f"chat data {text_path(path, 'chat data')!r}"
    for _, line in _lines(path, where)[:1]:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return "messages"  # read_conversations names the bad line
        if isinstance(obj, dict) and "prompt" in obj:
            return "completion"
    return "messages"


def read_completions(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The ``(prompt, completion)`` pairs of a JSON-lines file (blank lines skipped).

    Raises
    ------
    InvalidValueError
        Unreadable file, a line that is not JSON or not ``{"prompt": str, "completion": str}``
        with a non-empty completion, no pairs.
    """
    where = f"chat data {text_path(path, 'chat data')!r}"
    out = []
    for n, line in _lines(path, where):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InvalidValueError(f"{where}: line {n} is not JSON: {exc}") from None
        if not (isinstance(obj, dict) and isinstance(obj.get("prompt"), str)
                and isinstance(obj.get("completion"), str) and obj["completion"]):
            raise InvalidValueError(f'{where}: line {n}: expected {{"prompt": "...", '
                                    f'"completion": "..."}} with a non-empty completion')
        out.append((obj["prompt"], obj["completion"]))
    if not out:
        raise InvalidValueError(f"{where}: no prompt/completion pairs")
    return out


def completion_windows(tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]],
                       n_ctx: int) -> Windows:
    """One window per pair: inputs ``ids[:-1]``, labels ``ids[1:]`` masked where the next
    token is the prompt's, padded to ``n_ctx`` with EOS and masked labels.

    Raises
    ------
    ShapeError
        ``n_ctx`` not an int >= 1, a pair longer than ``n_ctx + 1`` tokens (raise ``--ctx``).
    OutOfMemoryError
        No memory for the windows.
    """
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise ShapeError(f"completion windows: the context must be an int >= 1, got {n_ctx!r}")
    eos = [] if tokenizer.eos is None else [tokenizer.eos]
    rows = []
    for i, (prompt, completion) in enumerate(pairs):
        p = tokenizer.encode(prompt, add_special=True, parse_special=False)
        c = tokenizer.encode(completion, add_special=False, parse_special=False) + eos
        if len(p) + len(c) > n_ctx + 1:
            raise ShapeError(f"chat data: pair {i + 1} has {len(p) + len(c)} tokens; a window "
                             f"of --ctx {n_ctx} holds {n_ctx + 1} (raise --ctx)")
        rows.append((p, c))
    pad = tokenizer.eos if tokenizer.eos is not None else 0
    try:
        tokens = np.full((len(rows), n_ctx), pad, np.int32)
        labels = np.full((len(rows), n_ctx), MASKED, np.int32)
    except (MemoryError, ValueError):
        raise OutOfMemoryError(f"completion windows: no memory for {len(rows)} windows of "
                               f"{n_ctx} tokens (a smaller --ctx)") from None
    for i, (p, c) in enumerate(rows):
        ids = np.asarray(p + c, np.int32)
        n = len(ids) - 1
        tokens[i, :n] = ids[:-1]
        start = max(len(p), 1)  # a first token with nothing before it is not predicted
        labels[i, start - 1:n] = ids[start:]  # the completion's tokens (and EOS)
    return Windows(tokens, labels)
