"""Chat data for supervised fine-tuning: JSON lines ``{"messages": [{"role", "content"}, ...]}``
rendered with the model's ``tokenizer.chat_template`` (jinja2, sandboxed, as Hugging Face
renders it: ``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``bos_token``,
``eos_token``), special tokens parsed, the loss only on the assistant's tokens.

Each conversation is cut where the rendering of ``messages[:k]`` (with the generation prompt)
ends and that of ``messages[:k+1]`` ends: the text in between an assistant message ``k``
produced (its content and the template's end of turn) is trained, the rest is masked. Each
piece is tokenized on its own and the ids concatenated. One conversation fills one window:
padded to ``n_ctx`` (with EOS, masked), never packed, so no conversation attends to another.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidValueError, OutOfMemoryError, ShapeError, StateError
from ..io.paths import text_path
from ..models.llama.vocab import Tokenizer
from .windows import MASKED, Windows

__all__ = ["read_conversations", "render", "conversation_ids", "chat_windows"]

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
        The template fails (``raise_exception``, an undefined name, a type error, ...).
    """
    if not tokenizer.chat_template:
        raise StateError("chat data: the model has no tokenizer.chat_template")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def conversation_ids(tokenizer: Tokenizer, messages: Sequence[Message]) -> tuple[list[int],
                                                                                 list[bool]]:
    """The conversation's token ids and, per id, whether it is the assistant's (trained).

    Raises
    ------
    InvalidValueError
        The template fails, or renders a shorter conversation as something other than a
        prefix of the longer one (the assistant's text cannot be located).
    """
    ids: list[int] = []
    trained: list[bool] = []
    done = ""
    for k, msg in enumerate(messages):
        cuts = [(render(tokenizer, messages[:k + 1], False), msg["role"] == "assistant")]
        if msg["role"] == "assistant":
            cuts.insert(0, (render(tokenizer, messages[:k], True), False))
        for text, is_answer in cuts:
            if not text.startswith(done):
                raise InvalidValueError(f"chat template: the rendering of messages[:{k + 1}] "
                                        f"does not extend that of the messages before it")
            piece = text[len(done):]
            if piece:
                new = tokenizer.encode(piece, add_special=not ids, parse_special=True)
                ids.extend(new)
                trained.extend([is_answer] * len(new))
            done = text
    return ids, trained


def chat_windows(tokenizer: Tokenizer, conversations: Sequence[Sequence[Message]],
                 n_ctx: int) -> Windows:
    """One window per conversation: inputs ``ids[:-1]``, labels ``ids[1:]`` (masked where the
    next token is not the assistant's), padded to ``n_ctx`` with EOS and masked labels.

    Raises
    ------
    ShapeError
        ``n_ctx`` not an int >= 1, a conversation longer than ``n_ctx + 1`` tokens (say how
        long; raise ``--ctx``) or shorter than 2 (nothing to predict).
    OutOfMemoryError
        No memory for the windows.
    """
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise ShapeError(f"chat windows: the context must be an int >= 1, got {n_ctx!r}")
    rendered = [conversation_ids(tokenizer, msgs) for msgs in conversations]
    for i, (ids, _) in enumerate(rendered):
        if len(ids) > n_ctx + 1:
            raise ShapeError(f"chat data: conversation {i + 1} has {len(ids)} tokens; a window "
                             f"of --ctx {n_ctx} holds {n_ctx + 1} (raise --ctx)")
        if len(ids) < 2:
            raise ShapeError(f"chat data: conversation {i + 1} renders to {len(ids)} token(s); "
                             f"a window needs at least 2 (one to predict)")
    pad = tokenizer.eos if tokenizer.eos is not None else 0
    try:
        tokens = np.full((len(conversations), n_ctx), pad, np.int32)
        labels = np.full((len(conversations), n_ctx), MASKED, np.int32)
    except (MemoryError, ValueError):  # ValueError: beyond NumPy's largest array
        raise OutOfMemoryError(f"chat windows: no memory for {len(conversations)} windows of "
                               f"{n_ctx} tokens (a smaller --ctx)") from None
    for i, (ids, trained) in enumerate(rendered):
        n = len(ids) - 1
        tokens[i, :n] = ids[:-1]
        target = np.asarray(ids[1:], np.int32)
        labels[i, :n] = np.where(np.asarray(trained[1:]), target, MASKED)
    return Windows(tokens, labels)
