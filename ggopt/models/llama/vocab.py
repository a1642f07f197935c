"""The tokenizer of a llama GGUF (:mod:`ggopt.tokenizers`), and the chat template."""

from __future__ import annotations

import os

from ...errors import GgoptError, StateError
from ...tokenizers import Tokenizer
from ...tokenizers import load as load_tokenizer

__all__ = ["Tokenizer", "tokenizer_of", "require"]


def tokenizer_of(path: str | os.PathLike[str]) -> Tokenizer | GgoptError:
    """The file's tokenizer, or the GgoptError saying why ggopt cannot tokenize for it (the
    model still runs on token ids)."""
    try:
        return load_tokenizer(path)
    except GgoptError as exc:
        return exc


def require(tokenizer: Tokenizer | GgoptError, where: str) -> Tokenizer:
    """``tokenizer``, or StateError with the reason it could not be made."""
    if isinstance(tokenizer, GgoptError):
        raise StateError(f"{where}: no tokenizer for this vocabulary ({tokenizer}); pass "
                         f"token ids instead") from None
    return tokenizer
