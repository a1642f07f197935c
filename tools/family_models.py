"""For the tests that use the real models of the families beyond llama
(``tools/fetch_models.py gemma3 qwen2`` puts them in ``GGOPT_CACHE``): their paths, and the
F32 copies made from them (cached beside them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggopt.models import llama
from tools.smollm import cache_dir

#: family -> (the shipped file, its F32 copy)
FILES = {"gemma3": ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m.F32.gguf"),
         "qwen2": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                   "qwen2.5-coder-0.5b-instruct.F32.gguf")}


def shipped_path(family: str) -> Path:
    """The shipped (Q4_K_M) file, or skip with how to get it."""
    path = cache_dir() / FILES[family][0]
    if not path.is_file():
        pytest.skip(f"{path} missing: python tools/fetch_models.py {family}")
    return path


def f32_path(family: str) -> Path:
    """The F32 copy of the shipped file (written once with ggopt.models.llama.write_f32)."""
    src, dst = shipped_path(family), cache_dir() / FILES[family][1]
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        llama.write_f32(src, dst)
    return dst
