"""Chat data for supervised fine-tuning: JSON lines ``{"messages": [{"role", "content"}, ...]}``
rendered with the model's ``tokenizer.chat_template`` (jinja2, sandboxed, under a budget:
:mod:`ggopt.tokenizers.chat`), special tokens parsed, the loss only on the assistant's tokens.

Each conversation is cut where the rendering of ``messages[:k]`` (with the generation prompt)
ends and that of ``messages[:k+1]`` ends: the text in between an assistant message ``k``
produced (its content and the template's end of turn) is trained, the rest is masked. The
template renders a conversation once (:func:`ggopt.tokenizers.chat_spans` finds the cuts);
each piece is tokenized on its own and the ids concatenated. One conversation fills one window,
padded to ``n_ctx`` (with EOS, masked); a longer one is truncated, skipped or refused
(``overflow``). With ``pack=True`` several conversations share a window (first-fit in data
order), each attending only to itself (:func:`ggopt.models.llama.set_segments`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidValueError, OutOfMemoryError, ShapeError, StateError
from ..io.paths import text_path
from ..models.llama.vocab import Tokenizer
from ..tokenizers.chat import DEFAULT_LIMITS, FAST_FROM, TemplateLimits, chat_spans
from .preflight import available_bytes
from .windows import MASKED, Overflow, Windows

__all__ = ["read_conversations", "render", "conversation_ids", "conversations_ids",
           "chat_windows", "first_fit", "Overflow", "OVERFLOW"]

#: What :func:`chat_windows` does with a conversation longer than a window.
OVERFLOW = ("truncate", "skip", "error")

Message = dict[str, str]


def read_conversations(path: str | os.PathLike[str]) -> list[list[Message]]:
    """The conversations of a JSON-lines file (blank lines skipped), every one checked.

    Raises
    ------
    InvalidValueError
        Unreadable file, a line that is not JSON, not ``{"messages": [...]}``, a message
        without string ``role``/``content``, a conversation without an assistant message.
    """
    where = f"chat data {text_path(path, 'chat data')!r}"
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidValueError(f"{where}: cannot read: {exc}") from None
    out: list[list[Message]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:  # also too long an int, too deep a nest
            raise InvalidValueError(f"{where}: line {lineno} is not JSON: {exc}") from None
        msgs = obj.get("messages") if isinstance(obj, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise InvalidValueError(f"{where}: line {lineno}: expected an object "
                                    '{"messages": [{"role": ..., "content": ...}, ...]}')
        for m in msgs:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                raise InvalidValueError(f"{where}: line {lineno}: every message needs string "
                                        f"'role' and 'content', got {m!r:.80}")
        if not any(m["role"] == "assistant" for m in msgs):
            raise InvalidValueError(f"{where}: line {lineno}: no assistant message (nothing "
                                    f"to train)")
        out.append([{"role": m["role"], "content": m["content"]} for m in msgs])
    if not out:
        raise InvalidValueError(f"{where}: no conversations")
    return out


def render(tokenizer: Tokenizer, messages: Sequence[Message],
           add_generation_prompt: bool) -> str:
    """``messages`` through the model's chat template (:meth:`Tokenizer.apply_chat_template`).

    Raises
    ------
    StateError
        The model has no ``tokenizer.chat_template``.
    InvalidValueError
        The template fails (``raise_exception``, an undefined name, a type error, a limit of
        its budget, ...).
    """
    if not tokenizer.chat_template:
        raise StateError("chat data: the model has no tokenizer.chat_template")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def conversations_ids(tokenizer: Tokenizer, conversations: Sequence[Sequence[Message]], *,
                      limits: TemplateLimits = DEFAULT_LIMITS,
                      fast_from: int = FAST_FROM) -> list[tuple[list[int], list[bool]]]:
    """Each conversation's token ids and, per id, whether it is the assistant's (trained);
    the template rendered in one worker call for all of them.

    Raises
    ------
    StateError
        The model has no ``tokenizer.chat_template``.
    InvalidValueError
        The template fails or exceeds ``limits``, or renders a shorter conversation as
        something other than a prefix of the longer one (the assistant's text cannot be
        located).
    """
    template = tokenizer.chat_template
    if not template:
        raise StateError("chat data: the model has no tokenizer.chat_template")
    bos, eos = tokenizer.special_texts
    spans = chat_spans(template, conversations, bos_token=bos, eos_token=eos, limits=limits,
                       source=tokenizer.source, fast_from=fast_from)
    out = []
    for text, cuts in spans:
        ids: list[int] = []
        trained: list[bool] = []
        start = 0
        # BOS as the vocabulary says, unless the template renders it (llama.cpp warns of the
        # two BOS that adding one more would give)
        first = not (bos and text.startswith(bos))
        for end, is_answer in cuts:
            new = tokenizer.encode(text[start:end], add_special=first and not ids,
                                   parse_special=True)
            ids.extend(new)
            trained.extend([is_answer] * len(new))
            start = end
        out.append((ids, trained))
    return out


def conversation_ids(tokenizer: Tokenizer, messages: Sequence[Message]) -> tuple[list[int],
                                                                                 list[bool]]:
    """The conversation's token ids and, per id, whether it is the assistant's (trained):
    :func:`conversations_ids` of one conversation."""
    return conversations_ids(tokenizer, [messages])[0]


def chat_windows(tokenizer: Tokenizer, conversations: Sequence[Sequence[Message]],
                 n_ctx: int, overflow: str = "truncate", *,
                 limits: TemplateLimits = DEFAULT_LIMITS, pack: bool = False) -> Windows:
    """One window per conversation: inputs ``ids[:-1]``, labels ``ids[1:]`` (masked where the
    next token is not the assistant's), padded to ``n_ctx`` with EOS and masked labels.

    ``pack=True``: each conversation's ``len(ids) - 1`` positions go, in data order, into the
    first window with room for them (first-fit; a new window when none has), the same inputs
    and labels as alone; :attr:`Windows.segments` says which conversation each position is
    of, and the model sees each on its own (positions from 0, a block-diagonal causal mask).

    A conversation of more than ``n_ctx + 1`` tokens: ``overflow="truncate"`` (default) keeps
    its first ``n_ctx + 1`` (the loss on the assistant tokens that fit), ``"skip"`` leaves it
    out, ``"error"`` refuses it; :attr:`Windows.overflow` counts them.

    Raises
    ------
    ShapeError
        ``n_ctx`` not an int >= 1, a conversation longer than ``n_ctx + 1`` tokens with
        ``overflow="error"`` (say how long; raise ``--ctx``) or shorter than 2 (nothing to
        predict).
    InvalidValueError
        ``overflow`` not one of :data:`OVERFLOW`; no assistant token left to train (the
        template never renders the assistant's text, or every conversation was skipped).
    OutOfMemoryError
        No memory for the windows: checked against the memory available before they are
        made (16 bytes per token of every window: tokens and labels, and the data set's copy).
    """
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise ShapeError(f"chat windows: the context must be an int >= 1, got {n_ctx!r}")
    if overflow not in OVERFLOW:
        raise InvalidValueError(f"chat windows: overflow must be one of {OVERFLOW}, got "
                                f"{overflow!r}")
    rendered = conversations_ids(tokenizer, conversations, limits=limits)
    kept: list[tuple[list[int], list[bool]]] = []
    truncated = skipped = lost = 0
    for i, (ids, trained) in enumerate(rendered):
        if len(ids) < 2:
            raise ShapeError(f"chat data: conversation {i + 1} renders to {len(ids)} token(s); "
                             f"a window needs at least 2 (one to predict)")
        if len(ids) > n_ctx + 1:
            if overflow == "error":
                raise ShapeError(f"chat data: conversation {i + 1} has {len(ids)} tokens; a "
                                 f"window of --ctx {n_ctx} holds {n_ctx + 1} (raise --ctx, or "
                                 f"--chat-overflow truncate/skip)")
            if overflow == "skip":
                skipped += 1
                lost += sum(trained[1:])
                continue
            truncated += 1
            lost += sum(trained[n_ctx + 1:])
            ids, trained = ids[:n_ctx + 1], trained[:n_ctx + 1]
        kept.append((ids, trained))
    report = Overflow(truncated, skipped, lost)
    if not kept:
        raise InvalidValueError(f"chat data: all {len(rendered)} conversations are longer than "
                                f"a window of --ctx {n_ctx} tokens (raise --ctx)")
    pad = tokenizer.eos if tokenizer.eos is not None else 0
    places = first_fit([len(ids) - 1 for ids, _ in kept], n_ctx) if pack else \
        [(i, 0) for i in range(len(kept))]
    n_windows = max(w for w, _ in places) + 1
    need, have = 16 * n_windows * n_ctx, available_bytes()  # the windows, then the data set
    if have is not None and need > have:
        raise OutOfMemoryError(f"chat windows: no memory for {n_windows} windows of {n_ctx} "
                               f"tokens: they need {need / 1e9:.2f} GB (tokens and labels, and "
                               f"the data set made of them), {have / 1e9:.2f} GB is available "
                               f"(fewer conversations or a smaller --ctx)")
    try:
        tokens = np.full((n_windows, n_ctx), pad, np.int32)
        labels = np.full((n_windows, n_ctx), MASKED, np.int32)
        segments = np.full((n_windows, n_ctx), -1, np.int32) if pack else None
    except (MemoryError, ValueError):  # ValueError: beyond NumPy's largest array
        raise OutOfMemoryError(f"chat windows: no memory for {n_windows} windows of "
                               f"{n_ctx} tokens (a smaller --ctx)") from None
    lengths = np.zeros(n_windows, np.int64)
    for (ids, trained), (w, at) in zip(kept, places, strict=True):
        n = len(ids) - 1
        tokens[w, at:at + n] = ids[:-1]
        target = np.asarray(ids[1:], np.int32)
        labels[w, at:at + n] = np.where(np.asarray(trained[1:], bool), target, MASKED)
        if segments is not None:
            segments[w, at:at + n] = segments[w, :at].max(initial=-1) + 1
        lengths[w] += n
    windows = Windows(tokens, labels, overflow=report, segments=segments, lengths=lengths)
    if not windows.n_trained():
        raise InvalidValueError(
            f"chat data: no assistant token to train in {len(kept)} conversation(s) (the chat "
            f"template of {tokenizer.source or 'the model'} never renders an assistant's "
            f"message where a prefix of the conversation ends; nothing would learn)")
    return windows


def first_fit(sizes: Sequence[int], n_ctx: int) -> list[tuple[int, int]]:
    """``(window, offset)`` of each size (each at most ``n_ctx``), in order: the first window
    whose free tail holds it, else a new one (first-fit in data order: deterministic, and an
    earlier item is never moved by a later one)."""
    free = np.zeros(0, np.int64)  # free positions at the end of each window
    out = []
    for n in sizes:
        fits = np.flatnonzero(free >= n)
        if fits.size:
            w = int(fits[0])
        else:
            w = len(free)
            free = np.append(free, n_ctx)
        out.append((w, n_ctx - int(free[w])))
        free[w] -= n
    return out
