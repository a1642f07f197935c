"""Products of a BF16 or F16 weight with float32 activations, as ggml's CPU backend defines
them: the activations rounded to the weight's type (round to nearest even), F32 sums. The
packed GEMM is ``_lowp_gemm.h``, with four kernels that compute the same bits: ``dpbf16``
(AVX-512 BF16's ``vdpbf16ps``; BF16 on AMD), ``fma`` (AVX-512F FMA on values widened to
float32; F16, and BF16 elsewhere), ``avx2`` (the same on AVX2 + FMA, with 256-bit vectors: a
CPU without AVX-512) and ``portable`` (any CPU).

``GGOPT_LOWP_KERNEL=portable|dpbf16|fma|avx2`` in the environment (read at import) or
:func:`set_kernel` forces one (tests). Shapes, types and thread counts are checked before
anything is written (ShapeError / DTypeError / InvalidValueError); the bits do not depend on
``n_threads``.
"""

import os

import numpy as np

from ggopt._kernels._common cimport check_n_threads

from ggopt.errors import DTypeError, InvalidValueError, ShapeError

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
        int kernel
        const unsigned int *wpacked
    int ggopt_lp_gemm(const ggopt_lp_args *a, int n_threads)
    size_t ggopt_lp_packed_words(int wtype, Py_ssize_t m, Py_ssize_t k)
    void ggopt_lp_pack_all(const ggopt_lp_args *a, unsigned int *dst, int n_threads)
    int ggopt_lp_hash(const unsigned short *w, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t rs,
                      Py_ssize_t cs, int n_threads, unsigned long long *out)
    void ggopt_lp_f32_to_bf16_n(const float *src, unsigned short *dst, Py_ssize_t n,
                                int n_threads)
    void ggopt_lp_bf16_to_f32_n(const unsigned short *src, float *dst, Py_ssize_t n,
                                int n_threads)
    int ggopt_lp_can_run(int kernel)
    int ggopt_lp_best_kernel(int wtype)

cdef enum:
    F16 = 1
    BF16 = 30

#: the kernels, by their ids in _lowp_gemm.h
KERNELS = ("portable", "dpbf16", "fma", "avx2")
cdef int _forced = -1   # a kernel id, or -1: the best this CPU runs


def available():
    """The kernels this CPU runs: ``portable`` always; ``avx2`` with AVX2 and FMA; ``fma`` with
    AVX-512F; ``dpbf16`` with AVX-512 BF16 too."""
    return [name for i, name in enumerate(KERNELS) if ggopt_lp_can_run(i)]


def set_kernel(name):
    """Force the kernel of every product (``None``: the best for this CPU, the default; tests
    compare the kernels). F16 weights run ``dpbf16`` as ``fma`` (it has no F16 form)."""
    global _forced
    if name is None:
        _forced = -1
        return
    if name not in KERNELS:
        raise InvalidValueError(f"set_kernel: unknown kernel {name!r}; expected one of "
                                f"{', '.join(KERNELS)} or None")
    if not ggopt_lp_can_run(KERNELS.index(name)):
        raise InvalidValueError(f"set_kernel: this CPU cannot run {name!r}; it runs "
                                f"{', '.join(available())}")
    _forced = KERNELS.index(name)


cdef int _kernel_id(int wtype) noexcept:
    if _forced < 0:
        return ggopt_lp_best_kernel(wtype)
    if wtype == F16 and _forced == 1:
        return 2
    return _forced


def kernel(int wtype):
    """The kernel products of ``wtype`` (1 = F16, 30 = BF16) run on now."""
    _check_type("kernel", wtype)
    return KERNELS[_kernel_id(wtype)]


_env = os.environ.get("GGOPT_LOWP_KERNEL", "").strip().lower()
if _env and _env != "auto":
    set_kernel(_env)


cdef int _check_type(str fn, int wtype) except -1:
    if wtype != F16 and wtype != BF16:
        raise DTypeError(f"{fn}: weight type {wtype} is not F16 (1) or BF16 (30)")
    return 0


cdef Py_ssize_t _elems(str fn, str name, Py_ssize_t stride, Py_ssize_t itemsize) except -1:
    if stride % itemsize:
        raise ShapeError(f"{fn}: {name}'s stride of {stride} bytes is not a whole number of "
                         f"{itemsize}-byte elements")
    return stride // itemsize


cdef int _weight_args(str fn, const unsigned short[:, :] w, int wtype, bint w_transposed,
                      ggopt_lp_args *a) except -1:
    """``a``'s weight fields (W, its strides, M, K, the type) from ``w``."""
    _check_type(fn, wtype)
    cdef Py_ssize_t ws0 = _elems(fn, "w", w.strides[0], 2), ws1 = _elems(fn, "w", w.strides[1], 2)
    a.w = &w[0, 0] if w.shape[0] > 0 and w.shape[1] > 0 else NULL
    a.w_rs, a.w_cs = (ws1, ws0) if w_transposed else (ws0, ws1)
    a.m = w.shape[1] if w_transposed else w.shape[0]
    a.k = w.shape[0] if w_transposed else w.shape[1]
    a.wtype = wtype
    a.wpacked = NULL
    return 0


def packed_words(int wtype, Py_ssize_t m, Py_ssize_t k):
    """The ``uint32`` words of :func:`lowp_pack`'s panels for ``m`` outputs and reduction ``k``."""
    _check_type("packed_words", wtype)
    return ggopt_lp_packed_words(wtype, m, k)


def lowp_pack(const unsigned short[:, :] w not None, int wtype, int n_threads,
              bint w_transposed=False):
    """W's panels packed for :func:`lowp_gemm` (``packed=``), as every product packs them
    (BF16: pairs of the reduction in 32-bit words, the same for every kernel; F16: float32):
    a ``uint32`` array of :func:`packed_words` words, about the weight's own bytes (BF16)."""
    fn = "lowp_pack"
    check_n_threads(fn, n_threads)
    cdef ggopt_lp_args a
    _weight_args(fn, w, wtype, w_transposed, &a)
    out = np.zeros(ggopt_lp_packed_words(wtype, a.m, a.k), np.uint32)
    cdef unsigned int[::1] dst = out
    if a.m > 0 and a.k > 0:
        with nogil:
            ggopt_lp_pack_all(&a, &dst[0], n_threads)
    return out


def lowp_hash(const unsigned short[:, :] w not None, int n_threads):
    """A 64-bit hash of ``w``'s bits and shape (any strides), the same for every thread count:
    what a cache of packed panels checks before each use."""
    fn = "lowp_hash"
    check_n_threads(fn, n_threads)
    cdef Py_ssize_t rs = _elems(fn, "w", w.strides[0], 2), cs = _elems(fn, "w", w.strides[1], 2)
    cdef const unsigned short *p = &w[0, 0] if w.shape[0] > 0 and w.shape[1] > 0 else NULL
    cdef unsigned long long h = 0
    cdef int rc
    cdef Py_ssize_t rows = w.shape[0], cols = w.shape[1]
    if p == NULL:
        rows = cols = 0
    with nogil:
        rc = ggopt_lp_hash(p, rows, cols, rs, cs, n_threads, &h)
    if rc != 0:
        raise MemoryError(f"{fn}: no memory for {w.shape[0]} row hashes")
    return h


def f32_to_bf16(const float[::1] src not None, unsigned short[::1] dst not None, int n_threads):
    """``dst`` = the BF16 bits of ``src`` (ggml's ``ggml_compute_fp32_to_bf16``: NaN made quiet,
    else round to nearest even, subnormals kept), on up to ``n_threads`` threads."""
    check_n_threads("f32_to_bf16", n_threads)
    if src.shape[0] != dst.shape[0]:
        raise ShapeError(f"f32_to_bf16: src has {src.shape[0]} values, dst {dst.shape[0]}")
    if src.shape[0] == 0:
        return
    with nogil:
        ggopt_lp_f32_to_bf16_n(&src[0], &dst[0], src.shape[0], n_threads)


def bf16_to_f32(const unsigned short[::1] src not None, float[::1] dst not None, int n_threads):
    """``dst`` = the float32 values of the BF16 bits ``src`` (exact)."""
    check_n_threads("bf16_to_f32", n_threads)
    if src.shape[0] != dst.shape[0]:
        raise ShapeError(f"bf16_to_f32: src has {src.shape[0]} values, dst {dst.shape[0]}")
    if src.shape[0] == 0:
        return
    with nogil:
        ggopt_lp_bf16_to_f32_n(&src[0], &dst[0], src.shape[0], n_threads)


def lowp_gemm(const unsigned short[:, :] w not None, int wtype, const float[:, :] x not None,
              float[:, :] out not None, int n_threads, bint w_transposed=False,
              const unsigned int[::1] packed=None):
    """``out = r(x) @ W.T`` with ``W = w`` (``(M, K)``, the raw F16/BF16 bits), or, with
    ``w_transposed``, ``W = w.T`` (``w`` is ``(K, M)``: out_prod's weight); ``x`` is
    ``(N, K)`` float32, ``out`` ``(N, M)``. ``r`` rounds to ``wtype``; sums are F32.
    ``packed``: ``lowp_pack(w, wtype, ., w_transposed)`` of these very bits (the caller's
    promise: a cache checks it with :func:`lowp_hash`), used instead of packing ``w``."""
    fn = "lowp_gemm"
    check_n_threads(fn, n_threads)
    cdef ggopt_lp_args a
    _weight_args(fn, w, wtype, w_transposed, &a)
    if x.shape[1] != a.k or out.shape[0] != x.shape[0] or out.shape[1] != a.m:
        raise ShapeError(f"{fn}: w {(w.shape[0], w.shape[1])} (transposed: {w_transposed}), "
                         f"x {(x.shape[0], x.shape[1])} and out {(out.shape[0], out.shape[1])} "
                         "do not fit "
                         "out = x @ W.T")
    if packed is not None:
        if <size_t>packed.shape[0] != ggopt_lp_packed_words(wtype, a.m, a.k):
            raise ShapeError(f"{fn}: packed has {packed.shape[0]} words; w's panels take "
                             f"{ggopt_lp_packed_words(wtype, a.m, a.k)}")
        if packed.shape[0] > 0:
            a.wpacked = &packed[0]
    a.x = &x[0, 0] if x.shape[0] > 0 and x.shape[1] > 0 else NULL
    a.x_rs = _elems(fn, "x", x.strides[0], 4)
    a.x_cs = _elems(fn, "x", x.strides[1], 4)
    a.c = &out[0, 0] if out.shape[0] > 0 and out.shape[1] > 0 else NULL
    a.c_rs = _elems(fn, "out", out.strides[0], 4)
    a.c_cs = _elems(fn, "out", out.strides[1], 4)
    a.n = x.shape[0]
    a.kernel = _kernel_id(wtype)
    cdef int rc
    if a.n == 0 or a.m == 0:
        return
    with nogil:
        rc = ggopt_lp_gemm(&a, n_threads)
    if rc != 0:
        raise MemoryError(f"{fn}: no memory for the packed operands")
