"""The llama example's GGUF files: :mod:`ggopt.models.llama.byte_gguf` (ggopt's byte-level
llama files that llama.cpp runs), re-exported under the example's names."""

from __future__ import annotations

from ..models.llama.byte_gguf import byte_tokens, load, save
from ..models.llama.config import ARCH

__all__ = ["ARCH", "byte_tokens", "save", "load"]
