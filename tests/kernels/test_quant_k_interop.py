"""ggopt's Q4_K / Q5_K / Q6_K dequantize against ggml's own C (``dequantize_row_q4_K``,
``_q5_K``, ``_q6_K`` of the ``libggml-base`` that llama-cpp-python ships), bit for bit:
the gguf package, the other tests' reference, is itself a port of that C. Marker ``interop``,
skipped unless ``GGOPT_INTEROP=1``:
``GGOPT_INTEROP=1 python -m pytest -m interop tests/kernels/test_quant_k_interop.py``."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

from ggopt import quants
from tools.kquants import K_TYPES, SCALE_AT, k_blocks

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]


def _ggml_base() -> ctypes.CDLL:
    llama_cpp = pytest.importorskip("llama_cpp")
    lib = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    if not lib.exists():
        pytest.skip(f"no {lib}")
    return ctypes.CDLL(str(lib))


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_dequantize_is_ggml_c_bit_for_bit(qtype):
    fn = getattr(_ggml_base(), f"dequantize_row_{qtype.name[:2].lower()}{qtype.name[2:]}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    raw = np.ascontiguousarray(k_blocks(qtype, 9, 1024, seed=11))
    rng = np.random.default_rng(12)  # and blocks of any bytes with finite scales
    wild = rng.integers(0, 256, (4, 4 * qtype.size), dtype=np.uint8).reshape(4, 4, qtype.size)
    for at in SCALE_AT[qtype]:
        wild[..., at + 1] &= 0xFB
    raw = np.concatenate([raw, wild.reshape(4, -1)])
    want = np.empty((raw.shape[0], 1024), np.float32)
    fn(raw.ctypes.data, want.ctypes.data, want.size)
    got = quants.dequantize(raw, qtype, n_threads=2)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
