"""The tokenizer of a llama GGUF: ggopt's byte vocabulary here, the others from
:mod:`ggopt.tokenizers` (gpt2 BPE, llama SPM) when that package is present."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from ...errors import InvalidValueError, StateError

__all__ = ["Tokenizer", "ByteTokenizer", "tokenizer_from_reader", "require",
           "render_chat"]


class Tokenizer(Protocol):
    """What generation and evaluation need of a tokenizer (llama.cpp's ``llama_tokenize``)."""

    bos: int | None
    eos: int | None
    eog: frozenset[int]
    chat_template: str | None

    def encode(self, text: str | bytes, *, add_special: bool = True,
               parse_special: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> bytes: ...


class ByteTokenizer:
    """llama.cpp's ``rwkv`` model with the 256 byte tokens: any bytes are their own ids, no
    BOS/EOS (generation stops only at its length), no chat template."""

    bos: int | None = None
    eos: int | None = None
    eog: frozenset[int] = frozenset()
    chat_template: str | None = None

    def encode(self, text: str | bytes, *, add_special: bool = True,
               parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8", errors="surrogateescape") if isinstance(text, str) else text
        return list(bytes(data))

    def decode(self, ids: Sequence[int]) -> bytes:
        bad = [i for i in ids if not 0 <= int(i) < 256]
        if bad:
            raise InvalidValueError(f"decode: token ids {bad[:5]} are not bytes (0..255)")
        return bytes(int(i) for i in ids)


def tokenizer_from_reader(reader: Any, is_bytes: bool) -> Tokenizer | None:
    """The tokenizer of a GGUF opened with ``gguf.GGUFReader``; None when it needs
    :mod:`ggopt.tokenizers` and that package is absent (token ids still work)."""
    if is_bytes:
        return ByteTokenizer()
    try:
        tokenizers = importlib.import_module("ggopt.tokenizers")
    except ImportError:
        return None
    tok: Tokenizer = tokenizers.from_gguf(reader)
    return tok


def render_chat(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> str:
    """``messages`` rendered with the tokenizer's chat template, ending with the assistant's
    generation prompt (:mod:`ggopt.tokenizers`' jinja2 renderer)."""
    try:
        tokenizers = importlib.import_module("ggopt.tokenizers")
    except ImportError:
        raise StateError("--chat: chat templates need ggopt.tokenizers, which is not "
                         "installed") from None
    text: str = tokenizers.render_chat(tokenizer, messages, add_generation_prompt=True)
    return text


def require(tokenizer: Tokenizer | None, where: str) -> Tokenizer:
    """``tokenizer``, or StateError when the model was loaded without one."""
    if tokenizer is None:
        raise StateError(f"{where}: this vocabulary needs ggopt.tokenizers, which is not "
                         f"installed; pass token ids instead")
    return tokenizer
