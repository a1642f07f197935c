"""Tokenizers read from a GGUF's ``tokenizer.ggml.*`` keys, tokenizing exactly as llama.cpp.

``load(path)`` (or ``from_gguf(reader)`` for a file already read, by
:func:`ggopt.io.gguf_reader.open_gguf` or ``gguf.GGUFReader``) returns a
:class:`Tokenizer`. Implemented: the ``rwkv`` byte vocabulary of ggopt's own models, ``gpt2``
byte-level BPE with the pre-tokenizers in :data:`PRE_TOKENIZERS`, and ``llama``
SentencePiece (scores, byte fallback). Anything else is refused with a GgoptError naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gguf import GGUFReader

from ggopt.io.gguf_reader import GGUFFile
from ggopt.tokenizers.chat import TemplateLimits, chat_spans, render_chat
from ggopt.tokenizers.fields import open_fields
from ggopt.tokenizers.pretokenize import PRE_TOKENIZERS
from ggopt.tokenizers.tokenizer import Tokenizer
from ggopt.tokenizers.vocab import MODELS, read_vocab

__all__ = ["Tokenizer", "load", "from_gguf", "render_chat", "chat_spans", "TemplateLimits",
           "MODELS", "PRE_TOKENIZERS"]


def from_gguf(source: GGUFFile | GGUFReader | Mapping[str, Any]) -> Tokenizer:
    """The tokenizer of a file already read (:func:`ggopt.io.gguf_reader.open_gguf`), an open
    ``gguf.GGUFReader`` or its ``fields`` mapping."""
    return Tokenizer(read_vocab(open_fields(source)))


def load(path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer of the GGUF file ``path`` (only its metadata is read)."""
    tok = Tokenizer(read_vocab(open_fields(path)))
    tok.source = os.fspath(path) if isinstance(path, str) else str(path)
    return tok
