"""The tokenizer of a llama GGUF (:mod:`ggopt.tokenizers`), and the chat template."""

from __future__ import annotations

import os

from ...errors import GgoptError, StateError
from ...io.gguf_reader import GGUFFile
from ...tokenizers import Tokenizer, from_gguf
from ...tokenizers import load as load_tokenizer

__all__ = ["Tokenizer", "tokenizer_of", "require"]


def tokenizer_of(path: str | os.PathLike[str], reader: GGUFFile | None = None
                 ) -> Tokenizer | GgoptError:
    """The tokenizer of the file at ``path`` (``reader``: the file, when already read), or the
    GgoptError saying why ggopt cannot tokenize for it (the model still runs on token ids)."""
    try:
        if reader is None:
            return load_tokenizer(path)
        tok = from_gguf(reader)
    except GgoptError as exc:
        return exc
    tok.source = os.fspath(path)
    return tok


def require(tokenizer: Tokenizer | GgoptError, where: str) -> Tokenizer:
    """``tokenizer``, or StateError with the reason it could not be made."""
    if isinstance(tokenizer, GgoptError):
        raise StateError(f"{where}: no tokenizer for this vocabulary ({tokenizer}); pass "
                         f"token ids instead") from None
    return tokenizer
