"""For the tests that use the real Gemma 3 270M (Q4_K_M, ``tools/fetch_models.py gemma3`` puts
it in ``GGOPT_CACHE``): its path, and the F32 copy made from it (cached beside it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggopt.models import llama
from tools.smollm import cache_dir

Q4_K_M_NAME = "gemma-3-270m-q4_k_m.gguf"
F32_NAME = "gemma-3-270m.F32.gguf"


def q4_k_m_path() -> Path:
    """The shipped Q4_K_M file, or skip with how to get it."""
    path = cache_dir() / Q4_K_M_NAME
    if not path.is_file():
        pytest.skip(f"{path} missing: python tools/fetch_models.py gemma3")
    return path


def f32_path() -> Path:
    """The F32 copy of the Q4_K_M file (written once with ggopt.models.llama.write_f32)."""
    src, dst = q4_k_m_path(), cache_dir() / F32_NAME
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        llama.write_f32(src, dst)
    return dst
