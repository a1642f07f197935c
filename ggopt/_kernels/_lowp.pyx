"""Products of a BF16 or F16 weight with float32 activations, as ggml's CPU backend defines
them: the activations rounded to the weight's type (round to nearest even), F32 sums. The
packed GEMM is ``_lowp_gemm.h``; BF16 runs on AVX-512 BF16 (``vdpbf16ps``) where the CPU has
it, else on a portable kernel that computes the same bits (F16: AVX-512F, else portable).

``GGOPT_LOWP_PORTABLE=1`` in the environment (read at import) or :func:`set_portable` forces
the portable kernels (tests). Shapes, types and thread counts are checked before anything is
written (ShapeError / DTypeError / InvalidValueError); the bits do not depend on ``n_threads``.
"""

import os

from ggopt._kernels._common cimport check_n_threads

from ggopt.errors import DTypeError, ShapeError

cdef extern from "_lowp_gemm.h" nogil:
    ctypedef struct ggopt_lp_args:
        const unsigned short *w
        Py_ssize_t w_rs, w_cs
        const float *x
        Py_ssize_t x_rs, x_cs
        float *c
        Py_ssize_t c_rs, c_cs
        Py_ssize_t n, m, k
        int wtype
    int ggopt_lp_gemm(const ggopt_lp_args *a, int n_threads, int hw)
    int ggopt_lp_has_hw(int wtype)

cdef enum:
    F16 = 1
    BF16 = 30

cdef bint _portable = os.environ.get("GGOPT_LOWP_PORTABLE", "").strip().lower() in (
    "1", "true", "yes", "on")


def set_portable(bint on):
    """Force the portable kernels (``on``) or let the CPU's units run (the default)."""
    global _portable
    _portable = on


def hardware(int wtype):
    """True when products of ``wtype`` (1 = F16, 30 = BF16) run on the CPU's vector units
    (AVX-512 BF16 / AVX-512F), False on the portable kernel (no such unit, or forced)."""
    _check_type("hardware", wtype)
    return (not _portable) and ggopt_lp_has_hw(wtype) != 0


cdef int _check_type(str fn, int wtype) except -1:
    if wtype != F16 and wtype != BF16:
        raise DTypeError(f"{fn}: weight type {wtype} is not F16 (1) or BF16 (30)")
    return 0


cdef Py_ssize_t _elems(str fn, str name, Py_ssize_t stride, Py_ssize_t itemsize) except -1:
    if stride % itemsize:
        raise ShapeError(f"{fn}: {name}'s stride of {stride} bytes is not a whole number of "
                         f"{itemsize}-byte elements")
    return stride // itemsize


def lowp_gemm(const unsigned short[:, :] w not None, int wtype, const float[:, :] x not None,
              float[:, :] out not None, int n_threads, bint w_transposed=False):
    """``out = r(x) @ W.T`` with ``W = w`` (``(M, K)``, the raw F16/BF16 bits), or, with
    ``w_transposed``, ``W = w.T`` (``w`` is ``(K, M)``: out_prod's weight); ``x`` is
    ``(N, K)`` float32, ``out`` ``(N, M)``. ``r`` rounds to ``wtype``; sums are F32."""
    fn = "lowp_gemm"
    _check_type(fn, wtype)
    check_n_threads(fn, n_threads)
    cdef Py_ssize_t M = w.shape[1] if w_transposed else w.shape[0]
    cdef Py_ssize_t K = w.shape[0] if w_transposed else w.shape[1]
    if x.shape[1] != K or out.shape[0] != x.shape[0] or out.shape[1] != M:
        raise ShapeError(f"{fn}: w {(w.shape[0], w.shape[1])} (transposed: {w_transposed}), "
                         f"x {(x.shape[0], x.shape[1])} and out {(out.shape[0], out.shape[1])} "
                         "do not fit "
                         "out = x @ W.T")
    cdef ggopt_lp_args a
    cdef Py_ssize_t ws0 = _elems(fn, "w", w.strides[0], 2), ws1 = _elems(fn, "w", w.strides[1], 2)
    a.w = &w[0, 0] if w.shape[0] > 0 and w.shape[1] > 0 else NULL
    a.w_rs, a.w_cs = (ws1, ws0) if w_transposed else (ws0, ws1)
    a.x = &x[0, 0] if x.shape[0] > 0 and x.shape[1] > 0 else NULL
    a.x_rs = _elems(fn, "x", x.strides[0], 4)
    a.x_cs = _elems(fn, "x", x.strides[1], 4)
    a.c = &out[0, 0] if out.shape[0] > 0 and out.shape[1] > 0 else NULL
    a.c_rs = _elems(fn, "out", out.strides[0], 4)
    a.c_cs = _elems(fn, "out", out.strides[1], 4)
    a.n, a.m, a.k, a.wtype = x.shape[0], M, K, wtype
    cdef int hw = (not _portable) and ggopt_lp_has_hw(wtype) != 0
    cdef int rc
    if a.n == 0 or a.m == 0:
        return
    with nogil:
        rc = ggopt_lp_gemm(&a, n_threads, hw)
    if rc != 0:
        raise MemoryError(f"{fn}: no memory for the packed operands")
