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




class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class _Tensor(ctypes.Structure):  # struct ggml_tensor's head, up to its data pointer
    _fields_ = [("type", ctypes.c_int32), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int32),
                ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p)]


class GgmlGraphs:
    """ggml's own ``mul_mat`` through its graph API (``ggml_init``, ``ggml_mul_mat``,
    ``ggml_graph_compute_with_ctx``): whatever path ggml takes for the shapes (for K-quant
    weights: vec_dot below 8 activation rows, its tiled matmul from 8 on)."""

    def __init__(self, cpu: ctypes.CDLL) -> None:
        base = ctypes.CDLL(str(Path(cpu._name).parent / "libggml-base.so"))
        pt = ctypes.POINTER(_Tensor)
        base.ggml_init.restype, base.ggml_init.argtypes = ctypes.c_void_p, [_InitParams]
        base.ggml_new_tensor_2d.restype = pt
        base.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                            ctypes.c_int64]
        base.ggml_mul_mat.restype = pt
        base.ggml_mul_mat.argtypes = [ctypes.c_void_p, pt, pt]
        base.ggml_new_graph.restype = ctypes.c_void_p
        base.ggml_new_graph.argtypes = [ctypes.c_void_p]
        base.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, pt]
        base.ggml_free.argtypes = [ctypes.c_void_p]
        cpu.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                    ctypes.c_int]
        cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
        self.base, self.cpu = base, cpu

    def mul_mat(self, qtype: GGType, raw: np.ndarray, x: np.ndarray,
                n_threads: int = 2) -> np.ndarray:
        """``x @ W.T`` (N x M) for ``raw``: M rows of ``qtype`` blocks, ``x``: N x K F32."""
        b = self.base
        (m, k), n = (raw.shape[0], x.shape[1]), x.shape[0]
        size = (16 << 20) + raw.nbytes + 3 * x.nbytes + 4 * m * n  # tensors and the graph
        ctx = b.ggml_init(_InitParams(size, None, False))
        try:
            a_t = b.ggml_new_tensor_2d(ctx, int(qtype), k, m)
            x_t = b.ggml_new_tensor_2d(ctx, int(GGType.F32), k, n)
            ctypes.memmove(a_t.contents.data, ptr(np.ascontiguousarray(raw)), raw.nbytes)
            ctypes.memmove(x_t.contents.data, ptr(np.ascontiguousarray(x, np.float32)), x.nbytes)
            c = b.ggml_mul_mat(ctx, a_t, x_t)
            graph = b.ggml_new_graph(ctx)
            b.ggml_build_forward_expand(graph, c)
            assert self.cpu.ggml_graph_compute_with_ctx(ctx, graph, n_threads) == 0
            buf = (ctypes.c_char * (4 * m * n)).from_address(c.contents.data)
            return np.frombuffer(buf, np.float32).reshape(n, m).copy()
        finally:
            b.ggml_free(ctx)
