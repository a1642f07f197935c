"""ggml's float order (``_ggml_order.h``): the forward ops of a graph built with
``ggml_order=True`` rounded as llama.cpp's x86-64 AVX2+FMA build rounds them, so that a model
gives llama.cpp's bits (docs/ggml-order.md).

Every function takes rows with a unit stride along each row (rows, and the 4-D operands' outer
axes, may be spaced freely), checks shapes before it writes, and gives bits that depend neither
on ``n_threads`` nor on the CPU (an AVX2+FMA version where the CPU has them, else the same
operations lane by lane; only a NaN's sign may differ between the two).
"""

from cython.parallel cimport prange
from libc.stdint cimport int8_t, int32_t, uint8_t
from libc.stdlib cimport free, malloc

from ggopt._kernels._common cimport check_n_threads, check_shape

import numpy as np

from ggopt._kernels import _quant_dot
from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import DTypeError, ShapeError

cdef extern from "_ggml_order.h" nogil:
    int ggopt_go_vector
    int ggopt_go_use_vector()
    int ggopt_q_block_bytes(int t)
    void ggopt_go_softmax_row(const float *x, const float *mask, float *y, float *w,
                              Py_ssize_t n, float scale, int pad8)
    void ggopt_go_swiglu_row(const float *x, const float *g, float *y, Py_ssize_t n)
    void ggopt_go_rms_norm_row(const float *x, float *y, Py_ssize_t n, float eps)
    void ggopt_go_dots(const float *a, Py_ssize_t lda, Py_ssize_t M, const float *y,
                       Py_ssize_t n, int tiny, float *out)
    void ggopt_go_qdot(int t, const uint8_t *w, Py_ssize_t ws, Py_ssize_t r0, Py_ssize_t r1,
                       Py_ssize_t nb, const int8_t *q, const float *d, const float *s,
                       const float *dT, const float *sT, Py_ssize_t n, float *out,
                       Py_ssize_t ldo, int8_t *scratch)

cdef extern from "_ggml_order_k.h" nogil:
    ctypedef struct ggopt_gok_block:
        pass
    void ggopt_gok_dot(int t, const uint8_t *w, Py_ssize_t ws, Py_ssize_t r0, Py_ssize_t r1,
                       Py_ssize_t nb, const int8_t *q, const float *d, const int32_t *bs,
                       Py_ssize_t n, float *out, Py_ssize_t ldo, void *scratch)

cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)

#: the weight types whose products have ggml's order here: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element
#: blocks) and Q2_K ... Q6_K (256-element super-blocks)
QUANT_TYPES = frozenset({2, 3, 6, 7, 8, 10, 11, 12, 13, 14})
_K_TYPES = frozenset({10, 11, 12, 13, 14})


def vector() -> bool:
    """True when the AVX2+FMA versions run (the CPU has AVX2, FMA and F16C)."""
    return bool(ggopt_go_use_vector())


def force_portable(bint on) -> None:
    """Run the lane-by-lane versions even where the CPU has AVX2 and FMA (tests: the same
    bits); ``False`` asks the CPU again."""
    global ggopt_go_vector
    ggopt_go_vector = 0 if on else -1


cdef int _unit(str fn, str name, Py_ssize_t n, Py_ssize_t stride) except -1:
    if n > 1 and stride != 4:
        raise ShapeError(f"{fn}: {name} needs a unit stride along its rows, got {stride} bytes")
    return 0


def _shape(a) -> tuple[int, ...]:
    return tuple(np.asarray(a).shape)


cdef inline int _threads(int n_threads, Py_ssize_t work) noexcept nogil:
    return n_threads if work >= _PAR_MIN_WORK else 1


def soft_max_rows(const float[:, :, :, :] x not None, const float[:, :, :, :] mask,
                  float[:, :, :, :] dst not None, float scale, int n_threads,
                  bint kv_padded=False) -> None:
    """``dst = softmax(x * scale + mask)`` along the last axis (ggml_soft_max_ext without
    ALiBi): ``x``, ``dst`` (n3, n2, R, n); ``mask`` None or (m3, m2, >= R, n), broadcast over
    the first two axes as ggml broadcasts it. ``kv_padded``: each row as if padded with masked
    slots to a multiple of 8 (llama.cpp's KV cache)."""
    cdef str fn = "soft_max (ggml order)"
    check_n_threads(fn, n_threads)
    cdef Py_ssize_t n3 = x.shape[0], n2 = x.shape[1], R = x.shape[2], n = x.shape[3]
    cdef Py_ssize_t rows = n3 * n2 * R, r, k, nt, i3, i2, i1, m3 = 1, m2 = 1
    if tuple([dst.shape[k] for k in range(4)]) != (n3, n2, R, n):
        raise ShapeError(f"{fn}: dst {_shape(dst)} must have x's shape "
                         f"{(n3, n2, R, n)}")
    _unit(fn, "x", n, x.strides[3])
    _unit(fn, "dst", n, dst.strides[3])
    cdef const char *mb = NULL
    cdef Py_ssize_t ms[3]
    if mask is not None:
        m3, m2 = mask.shape[0], mask.shape[1]
        if (mask.shape[3] != n or mask.shape[2] < R or m3 == 0 or m2 == 0 or n3 % m3
                or n2 % m2):
            raise ShapeError(f"{fn}: mask {_shape(mask)} does not broadcast over x "
                             f"{(n3, n2, R, n)}")
        _unit(fn, "mask", n, mask.strides[3])
        if rows and n:
            mb = <const char *>&mask[0, 0, 0, 0]
        for k in range(3):
            ms[k] = mask.strides[k]
    if rows == 0 or n == 0:
        return
    nt = _threads(n_threads, rows * n * 8)
    cdef Py_ssize_t nw = (n + 7) // 8 * 8
    cdef int pad = kv_padded
    cdef float *w = <float *>malloc(nt * nw * sizeof(float))
    if w == NULL:
        raise MemoryError(f"{fn}: no memory for {nt} rows of scratch")
    cdef const char *xb = <const char *>&x[0, 0, 0, 0]
    cdef char *db = <char *>&dst[0, 0, 0, 0]
    cdef Py_ssize_t xs0 = x.strides[0], xs1 = x.strides[1], xs2 = x.strides[2]
    cdef Py_ssize_t ds0 = dst.strides[0], ds1 = dst.strides[1], ds2 = dst.strides[2]
    try:
        for k in prange(nt, nogil=True, num_threads=nt, schedule="static"):
            for r in range(rows * k // nt, rows * (k + 1) // nt):
                i3 = r // (n2 * R)
                i2 = r // R % n2
                i1 = r % R
                ggopt_go_softmax_row(
                    <const float *>(xb + i3 * xs0 + i2 * xs1 + i1 * xs2),
                    <const float *>(mb + i3 % m3 * ms[0] + i2 % m2 * ms[1] + i1 * ms[2])
                    if mb != NULL else NULL,
                    <float *>(db + i3 * ds0 + i2 * ds1 + i1 * ds2), w + k * nw, n, scale, pad)
    finally:
        free(w)


def swiglu_rows(const float[:, :] x not None, const float[:, :] g not None,
                float[:, :] dst not None, int n_threads) -> None:
    """``dst = silu(x) * g`` per row (ggml_swiglu_split)."""
    cdef str fn = "swiglu (ggml order)"
    check_n_threads(fn, n_threads)
    cdef Py_ssize_t R = x.shape[0], n = x.shape[1], r
    check_shape(fn, "g", g.shape, 2, R, n)
    check_shape(fn, "dst", dst.shape, 2, R, n)
    _unit(fn, "x", n, x.strides[1])
    _unit(fn, "g", n, g.strides[1])
    _unit(fn, "dst", n, dst.strides[1])
    if R == 0 or n == 0:
        return
    cdef const char *xb = <const char *>&x[0, 0]
    cdef const char *gb = <const char *>&g[0, 0]
    cdef char *db = <char *>&dst[0, 0]
    cdef Py_ssize_t xs = x.strides[0], gs = g.strides[0], ds = dst.strides[0]
    for r in prange(R, nogil=True, num_threads=_threads(n_threads, R * n * 8),
                    schedule="static"):
        ggopt_go_swiglu_row(<const float *>(xb + r * xs), <const float *>(gb + r * gs),
                            <float *>(db + r * ds), n)


def rms_norm_rows(const float[:, :] x not None, float[:, :] dst not None, float eps,
                  int n_threads) -> None:
    """``dst = x / sqrt(mean(x**2) + eps)`` per row, the squares summed one after the other in
    double (ggml_rms_norm)."""
    cdef str fn = "rms_norm (ggml order)"
    check_n_threads(fn, n_threads)
    cdef Py_ssize_t R = x.shape[0], n = x.shape[1], r
    check_shape(fn, "dst", dst.shape, 2, R, n)
    _unit(fn, "x", n, x.strides[1])
    _unit(fn, "dst", n, dst.strides[1])
    if R == 0 or n == 0:
        return
    cdef const char *xb = <const char *>&x[0, 0]
    cdef char *db = <char *>&dst[0, 0]
    cdef Py_ssize_t xs = x.strides[0], ds = dst.strides[0]
    for r in prange(R, nogil=True, num_threads=_threads(n_threads, R * n * 4),
                    schedule="static"):
        ggopt_go_rms_norm_row(<const float *>(xb + r * xs), <float *>(db + r * ds), n, eps)


def tiny_order(Py_ssize_t K, Py_ssize_t M, Py_ssize_t N, bint b_contiguous) -> bool:
    """Whether ggml computes an F32 ``mul_mat`` (``a`` M x K, ``b`` N x K) with llamafile's
    tinyBLAS rather than ``ggml_vec_dot_f32``: ``b`` (its src1) contiguous, ``K`` a multiple of
    8, ``M`` of 4 and ``N >= 2`` (measured against llama-cpp-python 0.3.36's ``libggml-cpu``)."""
    return bool(b_contiguous and K % 8 == 0 and M % 4 == 0 and N >= 2)


def mul_mat_f32(const float[:, :, :, :] a not None, const float[:, :, :, :] b not None,
                float[:, :, :, :] out not None, bint tiny, int n_threads) -> None:
    """``out[i3, i2] = b[i3, i2] @ a[i3 // r3, i2 // r2].T`` (``a`` (A3, A2, M, K), ``b``
    (B3, B2, N, K), ``out`` (B3, B2, N, M): ggml's mul_mat, ``a`` broadcast), each output one
    dot in ggml's order: tinyBLAS's with ``tiny`` (``K`` not a multiple of 8: the reduction
    padded with zeros, as over llama.cpp's KV cache), else ``ggml_vec_dot_f32``'s (see
    :func:`tiny_order`)."""
    cdef str fn = "mul_mat (F32, ggml order)"
    check_n_threads(fn, n_threads)
    cdef Py_ssize_t A3 = a.shape[0], A2 = a.shape[1], M = a.shape[2], K = a.shape[3]
    cdef Py_ssize_t B3 = b.shape[0], B2 = b.shape[1], N = b.shape[2], j, k
    if b.shape[3] != K or A3 == 0 or A2 == 0 or B3 % A3 or B2 % A2:
        raise ShapeError(f"{fn}: a {_shape(a)} and b {_shape(b)} do not "
                         "match (K) or broadcast")
    if tuple([out.shape[k] for k in range(4)]) != (B3, B2, N, M):
        raise ShapeError(f"{fn}: out {_shape(out)} must be {(B3, B2, N, M)}")
    _unit(fn, "a", K, a.strides[3])
    _unit(fn, "b", K, b.strides[3])
    _unit(fn, "out", M, out.strides[3])
    if M > 1 and a.strides[2] % 4:
        raise ShapeError(f"{fn}: a's rows are not whole floats apart")
    cdef Py_ssize_t jobs = B3 * B2 * N
    if jobs == 0 or M == 0:
        return
    if K == 0:
        np.asarray(out)[...] = 0
        return
    cdef Py_ssize_t r3 = B3 // A3, r2 = B2 // A2, i3, i2, i1
    cdef const char *ab = <const char *>&a[0, 0, 0, 0]
    cdef const char *bb = <const char *>&b[0, 0, 0, 0]
    cdef char *ob = <char *>&out[0, 0, 0, 0]
    cdef Py_ssize_t as0 = a.strides[0], as1 = a.strides[1], lda = a.strides[2] // 4
    cdef Py_ssize_t bs0 = b.strides[0], bs1 = b.strides[1], bs2 = b.strides[2]
    cdef Py_ssize_t os0 = out.strides[0], os1 = out.strides[1], os2 = out.strides[2]
    cdef int t = tiny
    for j in prange(jobs, nogil=True, num_threads=_threads(n_threads, jobs * M * K),
                    schedule="static"):
        i3 = j // (B2 * N)
        i2 = j // N % B2
        i1 = j % N
        ggopt_go_dots(<const float *>(ab + i3 // r3 * as0 + i2 // r2 * as1), lda, M,
                      <const float *>(bb + i3 * bs0 + i2 * bs1 + i1 * bs2), K, t,
                      <float *>(ob + i3 * os0 + i2 * os1 + i1 * os2))


def mul_mat_quant(const uint8_t[:, :] w not None, int qtype, const float[:, :] x not None,
                  float[:, :] out not None, int n_threads) -> None:
    """``out = x @ W.T`` as ggml's AVX2 build computes mul_mat of a quantized weight ``w`` (M
    rows of blocks), ``x`` rounded to the type's vec_dot_type (as
    ``_quant_dot.quantize_activations``).

    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: per block 8 lanes of 4 integer products, each
    fused-multiply-added with the two scales' product, the lanes added as ``hsum_float_8``, then
    the blocks' ``m * s``. Q2_K ... Q6_K: each super-block's integer sums, rounded in ggml's
    vec_dot order below 8 rows of ``x`` and in its tiled matmul's from 8 on
    (``_ggml_order_k.h``; on AVX2 the tiled order's integers come from
    ``_quant_dot.mul_mat_q8(ggml_tiled=True)``)."""
    cdef str fn = "mul_mat (quantized, ggml order)"
    check_n_threads(fn, n_threads)
    if qtype not in QUANT_TYPES:
        raise DTypeError(f"{fn}: weight type {qtype} has no ggml-order product here (Q4_0, "
                         "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K ... Q6_K)")
    cdef int kq = qtype in _K_TYPES
    cdef Py_ssize_t M = w.shape[0], N = x.shape[0], K = x.shape[1], k, nt
    cdef Py_ssize_t qk = 256 if kq else 32
    cdef int bb = ggopt_q_block_bytes(qtype)
    if K % qk or w.shape[1] != K // qk * bb:
        raise ShapeError(f"{fn}: rows of {w.shape[1]} bytes are not {K} elements of type "
                         f"{qtype}")
    check_shape(fn, "out", out.shape, 2, N, M)
    if w.shape[1] > 1 and w.strides[1] != 1:
        raise ShapeError(f"{fn}: w needs a unit stride along its rows")
    _unit(fn, "out", M, out.strides[1])
    if N > 1 and out.strides[0] % 4:
        raise ShapeError(f"{fn}: out's rows are not whole floats apart")
    if N == 0 or M == 0:
        return
    if K == 0:
        np.asarray(out)[...] = 0
        return
    cdef Py_ssize_t nb = K // qk
    if kq and N >= 8 and ggopt_go_use_vector() and _quant_dot.has_ggml_tiled(qtype):
        # the tiled order's integers from ggopt's packed AVX2 kernel (4 activation rows x 16
        # weight rows a step), rounded in ggml's order: the same bits, 2-3x sooner
        _quant_dot.mul_mat_q8(w, qtype, x, out, n_threads, ggml_tiled=True)
        return
    # Q8_0's codes unbiased: the activation rounding of a Q4_0 weight (the same vec_dot_type)
    cdef int vt_of = 2 if qtype == 8 else qtype
    q = np.empty((N, K), np.int8)
    d = np.empty((N, nb), np.float32)
    s = np.empty((N, K // 32), np.float32)
    sums = np.empty((N, K // 16), np.int32)
    _quant_dot.quantize_activations(np.asarray(x), vt_of, q, d, s, sums, n_threads)
    # block-major copies for the tiles of 8 activation rows (fewer rows read them as they are):
    # the scales and Q8_1's s
    dT = np.ascontiguousarray(d.T) if N >= 8 and not kq else d
    sT = np.ascontiguousarray(s.T) if N >= 8 and qtype in (3, 7) else s
    cdef int8_t[:, ::1] qv = q
    cdef float[:, ::1] dv = d
    cdef float[:, ::1] sv = s
    cdef int32_t[:, ::1] bv = sums
    cdef float[:, ::1] dTv = dT
    cdef float[:, ::1] sTv = sT
    cdef const float *sp = &sv[0, 0] if qtype in (3, 7) else NULL
    cdef const float *sTp = &sTv[0, 0] if qtype in (3, 7) else NULL
    cdef const uint8_t *wb = &w[0, 0]
    cdef Py_ssize_t ws = w.strides[0], ldo = out.strides[0] // 4 if N > 1 else M
    cdef float *ob = &out[0, 0]
    nt = _threads(n_threads, M * N * K)
    # a decoded row per thread: K-quants their blocks and lanes, else 32 codes and 2 floats
    cdef Py_ssize_t row_bytes = nb * (sizeof(ggopt_gok_block) + 32) if kq else 40 * nb
    cdef char *scratch = <char *>malloc(nt * row_bytes)
    if scratch == NULL:
        raise MemoryError(f"{fn}: no memory for {nt} decoded rows")
    try:
        for k in prange(nt, nogil=True, num_threads=nt, schedule="static"):
            if kq:
                ggopt_gok_dot(qtype, wb, ws, M * k // nt, M * (k + 1) // nt, nb, &qv[0, 0],
                              &dv[0, 0], &bv[0, 0], N, ob, ldo, scratch + k * row_bytes)
            else:
                ggopt_go_qdot(qtype, wb, ws, M * k // nt, M * (k + 1) // nt, nb, &qv[0, 0],
                              &dv[0, 0], sp, &dTv[0, 0], sTp, N, ob, ldo,
                              <int8_t *>(scratch + k * row_bytes))
    finally:
        free(scratch)
