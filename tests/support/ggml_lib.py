"""The ``libggml-cpu`` that llama-cpp-python ships, loaded with ctypes, for the interop tests
of ggopt's kernels against ggml's own functions (:func:`load_ggml`: skips without
llama-cpp-python)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from ggopt.types import GGType

# weight type -> (ggml's activation quantizer, its block bytes, elements, the vec_dot)
GGML = {GGType.Q4_0: ("quantize_row_q8_0", 34, 32, "ggml_vec_dot_q4_0_q8_0"),
        GGType.Q5_0: ("quantize_row_q8_0", 34, 32, "ggml_vec_dot_q5_0_q8_0"),
        GGType.Q8_0: ("quantize_row_q8_0", 34, 32, "ggml_vec_dot_q8_0_q8_0"),
        GGType.Q4_1: ("quantize_row_q8_1", 36, 32, "ggml_vec_dot_q4_1_q8_1"),
        GGType.Q5_1: ("quantize_row_q8_1", 36, 32, "ggml_vec_dot_q5_1_q8_1"),
        GGType.Q2_K: ("quantize_row_q8_K", 292, 256, "ggml_vec_dot_q2_K_q8_K"),
        GGType.Q3_K: ("quantize_row_q8_K", 292, 256, "ggml_vec_dot_q3_K_q8_K"),
        GGType.Q4_K: ("quantize_row_q8_K", 292, 256, "ggml_vec_dot_q4_K_q8_K"),
        GGType.Q5_K: ("quantize_row_q8_K", 292, 256, "ggml_vec_dot_q5_K_q8_K"),
        GGType.Q6_K: ("quantize_row_q8_K", 292, 256, "ggml_vec_dot_q6_K_q8_K")}


def load_ggml() -> ctypes.CDLL:
    """The library, initialised (skips the calling test without llama-cpp-python)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    if not path.exists():
        pytest.skip(f"no {path}")
    lib = ctypes.CDLL(str(path))
    lib.ggml_cpu_init()
    return lib


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


def ggml_q8(lib: ctypes.CDLL, qtype: GGType, x: np.ndarray) -> np.ndarray:
    name, size, qb, _ = GGML[qtype]
    out = np.zeros((x.size // qb, size), np.uint8)
    getattr(lib, name)(ptr(x), ptr(out), ctypes.c_int64(x.size))
    return out


