"""Convolution kernels: im2col and im2col_back (pooling is ``_pool.pyx``; the direct
convolution ``_conv2d.pyx``).

float32 only. Arrays are in NumPy order (a ggml ``ne=[W, H, C, N]`` tensor is ``(N, C, H, W)``).
Inputs may have any byte strides; outputs are C-contiguous and are never allocated here. Each
kernel releases the GIL and runs an OpenMP ``prange`` over independent output blocks (an image
row), so no two threads ever write the same element. Each kernel checks its
shapes (the output shape must be the one ggml computes from the input and the window), window
parameters and thread count before it writes anything (ShapeError / InvalidValueError).

Parameter names follow ggml: index 0 acts on the width (last axis), index 1 on the height.
"""

import numpy as np

from cython.parallel cimport prange
from libc.string cimport memset

from ggopt._kernels._openmp cimport omp_get_thread_num

from ggopt._kernels._common cimport (
    check_n_threads,
    check_positive,
    check_shape,
    check_strides_pads_dilations,
)

from ggopt._kernels._openmp_helpers import min_parallel_work

# Below this much work (output elements times window size) a kernel runs on the calling thread.
cdef Py_ssize_t MIN_PARALLEL_WORK = min_parallel_work(1 << 12)


cdef int _check_window(str fn, int k0, int k1, int s0, int s1, int p0, int p1, int d0,
                       int d1) except -1:
    """Window sizes, strides and dilations >= 1, paddings >= 0."""
    check_positive(fn, "k0 (window width)", k0)
    check_positive(fn, "k1 (window height)", k1)
    check_strides_pads_dilations(fn, s0, s1, p0, p1, d0, d1)
    return 0


cdef inline Py_ssize_t _conv_out(Py_ssize_t size, int k, int s, int p, int d) noexcept nogil:
    """ggml's convolution output length (0 when the dilated window does not fit)."""
    cdef Py_ssize_t span = size + 2 * <Py_ssize_t>p - <Py_ssize_t>d * (k - 1) - 1
    return span // s + 1 if span >= 0 else 0


cdef inline Py_ssize_t _padded_extent(Py_ssize_t size, int pad, Py_ssize_t n_out, int stride,
                                      int k, int dil) noexcept nogil:
    """Length of a zero-padded axis that covers ``size + pad`` and every window read."""
    cdef Py_ssize_t need = (n_out - 1) * stride + (k - 1) * dil + 1
    return need if need > size + pad else size + pad


cdef inline void _padded_row(float* prow, Py_ssize_t PW, const char* xrow, Py_ssize_t IW,
                             Py_ssize_t sx, int p0) noexcept nogil:
    """Write ``[0]*p0 + x_row + [0]*...`` into ``prow`` (PW floats); NULL ``xrow``: all zeros.

    Plain loops rather than memset/memcpy: the rows are short and the calls would dominate.
    """
    cdef Py_ssize_t j
    cdef const float* xf = <const float*>xrow
    if xrow == NULL:
        for j in range(PW):
            prow[j] = 0.0
        return
    for j in range(p0):
        prow[j] = 0.0
    if sx == <Py_ssize_t>sizeof(float):
        for j in range(IW):
            prow[p0 + j] = xf[j]
    else:
        for j in range(IW):
            prow[p0 + j] = (<const float*>(xrow + j * sx))[0]
    for j in range(p0 + IW, PW):
        prow[j] = 0.0


cdef void _im2col_row(const char* xn, float* drow, float* strip, Py_ssize_t oh,
                      Py_ssize_t IC, Py_ssize_t IH, Py_ssize_t IW, Py_ssize_t OW, Py_ssize_t PW,
                      Py_ssize_t sc, Py_ssize_t sy, Py_ssize_t sx,
                      int KH, int KW, int s0, int s1, int p0, int p1,
                      int d0, int d1) noexcept nogil:
    """Fill ``drow`` (OW, IC*KH*KW), the im2col block of output row ``oh`` of one image.

    The IC*KH input rows it reads are first copied, zero-padded, into ``strip`` (IC*KH, PW),
    so that the gather writes ``drow`` in order without bounds checks.
    """
    cdef Py_ssize_t R = IC * KH
    cdef Py_ssize_t ic, kh, kw, ow, iy, _r
    cdef const float* s
    cdef float* d = drow
    for ic in range(IC):
        for kh in range(KH):
            iy = oh * s1 + kh * d1 - p1
            _padded_row(strip + (ic * KH + kh) * PW, PW,
                        xn + ic * sc + iy * sy if 0 <= iy < IH else NULL, IW, sx, p0)
    for ow in range(OW):
        s = strip + ow * s0
        if KW == 3 and d0 == 1:
            for _r in range(R):
                d[0] = s[0]
                d[1] = s[1]
                d[2] = s[2]
                d += 3
                s += PW
        else:
            for _r in range(R):
                for kw in range(KW):
                    d[kw] = s[kw * d0]
                d += KW
                s += PW


def im2col(const float[:, :, :, :] x not None, float[:, :, :, ::1] dst not None, int KH, int KW,
           int s0, int s1, int p0, int p1, int d0, int d1, int n_threads):
    """Unfold convolution windows: ``dst[n, oh, ow, (ic*KH + kh)*KW + kw]``.

    Parameters
    ----------
    x : (N, IC, IH, IW) float32, any strides
    dst : (N, OH, OW, IC*KH*KW) float32, C-contiguous, overwritten. Entry
        ``x[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]``, or 0 outside ``x``.
    KH, KW, s0, s1, p0, p1, d0, d1 : int
        Kernel size, stride, padding, dilation (index 0: width, 1: height).
    n_threads : int

    ggml: ggml_compute_forward_im2col (F32 destination)
    """
    cdef str fn = "im2col (ggml_im2col)"
    check_n_threads(fn, n_threads)
    _check_window(fn, KW, KH, s0, s1, p0, p1, d0, d1)
    cdef Py_ssize_t IC = x.shape[1], IH = x.shape[2], IW = x.shape[3]
    check_shape(fn, "dst", dst.shape, 4, x.shape[0], _conv_out(IH, KH, s1, p1, d1),
                _conv_out(IW, KW, s0, p0, d0), IC * KH * KW)
    cdef Py_ssize_t N = dst.shape[0], OH = dst.shape[1], OW = dst.shape[2], K = dst.shape[3]
    cdef Py_ssize_t nrows = N * OH, row
    if nrows * OW * K == 0:
        return
    if IH == 0 or IW == 0:
        memset(&dst[0, 0, 0, 0], 0, nrows * OW * K * sizeof(float))
        return
    cdef Py_ssize_t PW = _padded_extent(IW, p0, OW, s0, KW, d0)
    # One padded row strip per OpenMP thread, indexed by omp_get_thread_num().
    cdef Py_ssize_t strip_size = IC * KH * PW
    cdef float[:, ::1] scratch = np.empty((max(n_threads, 1), strip_size), np.float32)
    cdef float* sb = &scratch[0, 0]
    cdef const char* xb = <const char*>&x[0, 0, 0, 0]
    cdef float* db = &dst[0, 0, 0, 0]
    cdef Py_ssize_t sn = x.strides[0], sc = x.strides[1], sy = x.strides[2], sx = x.strides[3]
    for row in prange(nrows, nogil=True, schedule="static", num_threads=n_threads,
                      use_threads_if=nrows * OW * K >= MIN_PARALLEL_WORK):
        _im2col_row(xb + (row // OH) * sn, db + row * OW * K,
                    sb + omp_get_thread_num() * strip_size, row % OH, IC, IH, IW, OW, PW,
                    sc, sy, sx, KH, KW, s0, s1, p0, p1, d0, d1)


cdef void _im2col_back_image(const char* gn, Py_ssize_t gsy, Py_ssize_t gsx, Py_ssize_t gsk,
                             float* pad, Py_ssize_t PH, Py_ssize_t PW, float* dn,
                             Py_ssize_t IC, Py_ssize_t IH, Py_ssize_t IW,
                             Py_ssize_t OH, Py_ssize_t OW,
                             int KH, int KW, int s0, int s1, int p0, int p1,
                             int d0, int d1) noexcept nogil:
    """Fold one image's ``gn`` (OH, OW, K) into ``dn`` (IC, IH, IW).

    Sums go to the zero-padded copy ``pad`` (IC, PH, PW) in ``g``'s order, without bounds
    checks, and the interior is copied out at the end.
    """
    cdef Py_ssize_t oh, ow, ic, kh, kw, iy, ix
    cdef const char* gp
    cdef const float* gf
    cdef float* base
    cdef float* prow
    cdef bint g_contiguous = gsk == <Py_ssize_t>sizeof(float)
    memset(pad, 0, IC * PH * PW * sizeof(float))
    for oh in range(OH):
        for ow in range(OW):
            gp = gn + oh * gsy + ow * gsx
            gf = <const float*>gp
            base = pad + oh * s1 * PW + ow * s0
            for ic in range(IC):
                for kh in range(KH):
                    prow = base + (ic * PH + kh * d1) * PW
                    if g_contiguous and KW == 3 and d0 == 1:
                        prow[0] += gf[0]
                        prow[1] += gf[1]
                        prow[2] += gf[2]
                        gf += 3
                    elif g_contiguous:
                        for kw in range(KW):
                            prow[kw * d0] += gf[kw]
                        gf += KW
                    else:
                        for kw in range(KW):
                            prow[kw * d0] += (<const float*>gp)[0]
                            gp += gsk
    for ic in range(IC):
        for iy in range(IH):
            base = pad + (ic * PH + iy + p1) * PW + p0
            prow = dn + (ic * IH + iy) * IW
            for ix in range(IW):
                prow[ix] = base[ix]


def im2col_back(const float[:, :, :, :] g not None, float[:, :, :, ::1] dst not None, int KH,
                int KW, int s0, int s1, int p0, int p1, int d0, int d1, int n_threads):
    """Fold ``g`` back onto the image: the adjoint of :func:`im2col`.

    Parameters
    ----------
    g : (N, OH, OW, IC*KH*KW) float32, any strides
    dst : (N, IC, IH, IW) float32, C-contiguous, overwritten with, for every pixel, the sum
        of the ``g`` entries whose im2col source is that pixel.
    KH, KW, s0, s1, p0, p1, d0, d1 : int
        As for :func:`im2col`.
    n_threads : int

    ggml: ggml_compute_forward_im2col_back_f32
    """
    cdef str fn = "im2col_back (ggml_im2col_back)"
    check_n_threads(fn, n_threads)
    _check_window(fn, KW, KH, s0, s1, p0, p1, d0, d1)
    cdef Py_ssize_t N = dst.shape[0], IC = dst.shape[1], IH = dst.shape[2], IW = dst.shape[3]
    check_shape(fn, "g", g.shape, 4, N, _conv_out(IH, KH, s1, p1, d1),
                _conv_out(IW, KW, s0, p0, d0), IC * KH * KW)
    cdef Py_ssize_t OH = g.shape[1], OW = g.shape[2]
    cdef Py_ssize_t n
    if N * IC * IH * IW == 0:
        return
    cdef float* db = &dst[0, 0, 0, 0]
    if OH == 0 or OW == 0:
        memset(db, 0, N * IC * IH * IW * sizeof(float))
        return
    cdef Py_ssize_t PH = _padded_extent(IH, p1, OH, s1, KH, d1)
    cdef Py_ssize_t PW = _padded_extent(IW, p0, OW, s0, KW, d0)
    # One padded image per OpenMP thread, indexed by omp_get_thread_num().
    cdef Py_ssize_t pad_size = IC * PH * PW
    cdef float[:, ::1] scratch = np.empty((max(n_threads, 1), pad_size), np.float32)
    cdef float* sb = &scratch[0, 0]
    cdef const char* gb = <const char*>&g[0, 0, 0, 0]
    cdef Py_ssize_t gsn = g.strides[0], gsy = g.strides[1], gsx = g.strides[2]
    cdef Py_ssize_t gsk = g.strides[3]
    for n in prange(N, nogil=True, schedule="static", num_threads=n_threads,
                    use_threads_if=N * OH * OW * g.shape[3] >= MIN_PARALLEL_WORK):
        _im2col_back_image(gb + n * gsn, gsy, gsx, gsk, sb + omp_get_thread_num() * pad_size,
                           PH, PW, db + n * IC * IH * IW, IC, IH, IW, OH, OW,
                           KH, KW, s0, s1, p0, p1, d0, d1)
