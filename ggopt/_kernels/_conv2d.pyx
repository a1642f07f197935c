"""Direct 2-D convolution kernels: conv_2d, conv_2d_back_input, conv_2d_back_kernel.

float32 only; arrays in NumPy order (a ggml ``ne=[W, H, C, N]`` tensor is ``(N, C, H, W)``,
a kernel ``ne=[KW, KH, IC, OC]`` is ``(OC, IC, KH, KW)``). Inputs may have any byte strides;
outputs are C-contiguous and are never allocated here.

Each image is cut into blocks of output positions whose size depends only on the shapes. For
a block the kernel builds its patch matrix ``P`` (a row per kernel tap, a column per output
position, 0 for the padding; see ``_conv2d_blocks.pxd``) in a scratch of the calling thread
small enough to stay in cache, and does the block's product with BLAS ``sgemm`` on that
thread (BLAS is called from inside the OpenMP loop with the GIL released; ggopt holds BLAS
itself on one thread while graphs compute):

- forward: ``Y[n][:, block] = K @ P``, into the NCHW output;
- input gradient: ``dP = K^T @ dY[n][:, block]``, folded back onto ``dX[n]`` (the adjoint of
  building ``P``); each image belongs to one thread;
- kernel gradient: ``dK = sum_n dY[n] @ P[n]^T``; the images form a fixed number of groups
  (set by the shapes), each summed into its own partial, and the partials are added in group
  order.

Work is split only along bounds set by the shapes, so the results do not depend on the thread
count; the images (groups) go to the threads dynamically, so a thread slowed by another
process does not hold up the others. Each kernel checks its thread count, window parameters and
every shape before it writes anything (ShapeError / InvalidValueError). Parameter names follow
ggml: index 0 acts on the width (last axis), index 1 on the height.
"""

import numpy as np

from cython.parallel cimport prange
from libc.string cimport memset
from scipy.linalg.cython_blas cimport sgemm

from ggopt._kernels._openmp cimport omp_get_thread_num

from ggopt._kernels._common cimport (
    check_n_threads,
    check_shape,
    check_strides_pads_dilations,
)
from ggopt._kernels._conv2d_blocks cimport (
    Geometry,
    Image,
    all_finite,
    block_to_rows,
    conv_out,
    image_at,
    pad_image,
    plan_blocks,
    position_fold,
    position_patches,
    position_rows,
    row_fold,
    row_patches,
    rows_to_block,
    unpad_image,
    zero_junk,
)

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

# The kernel gradient sums at most this many per-group partials ...
cdef Py_ssize_t MAX_KGRAD_GROUPS = 32
# ... holding together at most this many floats (at least one partial).
cdef Py_ssize_t PARTIALS_BUDGET = 1 << 22
# BLAS takes its sizes as C ints.
cdef Py_ssize_t BLAS_INT_LIMIT = 2147483647
# Below this many multiply-adds a kernel runs on the calling thread.
cdef Py_ssize_t MIN_PARALLEL_WORK = min_parallel_work(1 << 16)


cdef int _set_geometry(str fn, Geometry* g, Py_ssize_t N, Py_ssize_t IC, Py_ssize_t IH,
                       Py_ssize_t IW, Py_ssize_t OC, Py_ssize_t KH, Py_ssize_t KW, int s0,
                       int s1, int p0, int p1, int d0, int d1) except -1:
    """Check the window parameters and fill ``g`` (the output size follows from them)."""
    check_strides_pads_dilations(fn, s0, s1, p0, p1, d0, d1)
    if KH < 1 or KW < 1 or KH > BLAS_INT_LIMIT or KW > BLAS_INT_LIMIT:
        raise ShapeError(f"{fn}: the kernel must be at least 1x1 and below 2**31 a side, got "
                         f"KH={KH}, KW={KW}")
    g.N, g.IC, g.IH, g.IW, g.OC = N, IC, IH, IW, OC
    g.KH, g.KW, g.s0, g.s1, g.p0, g.p1, g.d0, g.d1 = KH, KW, s0, s1, p0, p1, d0, d1
    g.OH = conv_out(IH, KH, s1, p1, d1)
    g.OW = conv_out(IW, KW, s0, p0, d0)
    g.M = g.OH * g.OW
    g.KK = IC * KH * KW
    if g.M > BLAS_INT_LIMIT or g.KK > BLAS_INT_LIMIT or OC > BLAS_INT_LIMIT:
        raise ShapeError(f"{fn}: OH*OW={g.M}, IC*KH*KW={g.KK} and OC={OC} must each be below "
                         "2**31 (BLAS sizes)")
    plan_blocks(g)
    return 0


cdef inline bint _is_matrix(Image a, const Geometry* g) noexcept nogil:
    """True when an (OC, OH, OW) output gradient is a BLAS matrix (OC, OH*OW): unit column
    stride, rows of OH*OW contiguous floats, a row stride of whole floats, at least OH*OW and
    below 2**31."""
    cdef Py_ssize_t f = sizeof(float)
    return ((a.sx == f or g.OW == 1) and (a.sy == g.OW * f or g.OH == 1)
            and (g.OC == 1 or (a.sc % f == 0 and a.sc >= g.M * f
                               and a.sc // f <= BLAS_INT_LIMIT)))


cdef inline Image _image(const float[:, :, :, :] a) noexcept:
    """Image 0 of ``a``."""
    cdef Image im
    im.data = <const char*>&a[0, 0, 0, 0]
    im.sc, im.sy, im.sx = a.strides[1], a.strides[2], a.strides[3]
    return im


def _kernel_matrix(const float[:, :, :, :] k):
    """The kernel as a C-contiguous (OC, IC*KH*KW) array (a copy only when it is not one)."""
    a = np.asarray(k)
    return np.ascontiguousarray(a).reshape(a.shape[0], -1)


cdef _scratch(const Geometry* g, int n_threads):
    """One scratch row per thread: the padded image (0), then a patch matrix and an output
    (gradient) block."""
    return np.zeros((n_threads, g.pad_size + (g.KK + g.OC) * g.chunk), np.float32)


cdef void _forward_image(const Geometry* g, Image x, const float* K, float* y,
                         float* scratch) noexcept nogil:
    """``y`` (OC, OH, OW), C-contiguous: the convolution of one image."""
    cdef float* pad = scratch
    cdef float* P = scratch + g.pad_size
    cdef float* Y = P + g.KK * g.chunk
    cdef Py_ssize_t first, last
    cdef int cols, oc = <int>g.OC, kk = <int>g.KK, ldy = <int>g.M
    cdef float one = 1.0, zero = 0.0
    cdef char no = b'N'
    if g.rows:
        pad_image(g, x, pad)
    first = 0
    while first < g.units:
        last = min(first + g.per_block, g.units)
        if g.rows:
            row_patches(g, pad, P, first, last - first)
            cols = <int>((last - first) * g.PW)
            # column-major: Y (cols, OC) = P (cols, KK) * K (KK, OC), then the junk dropped
            sgemm(&no, &no, &cols, &oc, &kk, &one, P, &cols, <float*>K, &kk, &zero, Y, &cols)
            block_to_rows(g, Y, y, first, last - first)
        else:
            position_patches(g, x, P, first, last)
            cols = <int>(last - first)
            # column-major: y[:, first:last] (cols, OC; ld M) = P (cols, KK) * K (KK, OC)
            sgemm(&no, &no, &cols, &oc, &kk, &one, P, &cols, <float*>K, &kk, &zero, y + first,
                  &ldy)
        first = last


def conv_2d(const float[:, :, :, :] k not None, const float[:, :, :, :] x not None,
            float[:, :, :, ::1] dst not None, int s0, int s1, int p0, int p1, int d0, int d1,
            int n_threads):
    """2-D cross-correlation: ``dst[n, oc, oh, ow] = sum k[oc, ic, kh, kw] *
    x[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]`` (0 outside ``x``).

    Parameters
    ----------
    k : (OC, IC, KH, KW) float32, any strides
    x : (N, IC, IH, IW) float32, any strides
    dst : (N, OC, OH, OW) float32, C-contiguous, overwritten
    s0, s1, p0, p1, d0, d1 : int
        Stride, padding, dilation (index 0: width, 1: height).
    n_threads : int

    ggml: ggml_conv_2d_direct (GGML_OP_CONV_2D)
    """
    cdef str fn = "conv_2d (ggml_conv_2d_direct)"
    check_n_threads(fn, n_threads)
    cdef Geometry g
    _set_geometry(fn, &g, x.shape[0], x.shape[1], x.shape[2], x.shape[3], k.shape[0],
                  k.shape[2], k.shape[3], s0, s1, p0, p1, d0, d1)
    check_shape(fn, "k", k.shape, 2, g.OC, g.IC)
    check_shape(fn, "dst", dst.shape, 4, g.N, g.OC, g.OH, g.OW)
    cdef Py_ssize_t total = g.N * g.OC * g.M
    if total == 0:
        return
    if g.KK == 0:
        memset(&dst[0, 0, 0, 0], 0, total * sizeof(float))
        return
    cdef const float[:, ::1] kmat = _kernel_matrix(k)
    cdef int team = <int>min(n_threads, g.N)
    cdef float[:, ::1] scratch = _scratch(&g, team)
    cdef Py_ssize_t per_thread = scratch.shape[1]
    cdef float* sb = &scratch[0, 0]
    cdef Image x0 = _image(x)
    cdef Py_ssize_t sn = x.strides[0], n
    cdef float* db = &dst[0, 0, 0, 0]
    cdef const float* kb = &kmat[0, 0]
    for n in prange(g.N, nogil=True, schedule="dynamic", num_threads=team,
                    use_threads_if=total * g.KK >= MIN_PARALLEL_WORK):
        _forward_image(&g, image_at(x0, n * sn), kb, db + n * g.OC * g.M,
                       sb + omp_get_thread_num() * per_thread)


cdef void _back_input_image(const Geometry* g, Image gy, bint matrix, const float* K,
                            bint k_finite, float* dx, float* scratch) noexcept nogil:
    """``dx`` (IC, IH, IW), C-contiguous: the input gradient of one image."""
    cdef float* pad = scratch
    cdef float* dP = scratch + g.pad_size
    cdef float* G = dP + g.KK * g.chunk
    cdef const float* Gb = G
    cdef Py_ssize_t first, last
    cdef int cols, ldg, oc = <int>g.OC, kk = <int>g.KK
    cdef float one = 1.0, zero = 0.0
    cdef char no = b'N', tr = b'T'
    if g.rows:
        memset(pad, 0, g.pad_size * sizeof(float))
    else:
        memset(dx, 0, g.IC * g.IH * g.IW * sizeof(float))
    first = 0
    while first < g.units:
        last = min(first + g.per_block, g.units)
        if g.rows:
            rows_to_block(g, gy, G, first, last - first)
            cols = <int>((last - first) * g.PW)
            ldg = cols
        else:
            Gb = position_rows(g, gy, matrix, first, last, G, &ldg)
            cols = <int>(last - first)
        # column-major: dP (cols, KK) = G (cols, OC) * K^T (OC, KK)
        sgemm(&no, &tr, &cols, &kk, &oc, &one, <float*>Gb, &ldg, <float*>K, &kk, &zero,
              dP, &cols)
        if g.rows:
            if not k_finite:  # the junk columns are K^T @ 0, NaN for an infinite K
                zero_junk(g, dP, g.KK, last - first)
            row_fold(g, dP, pad, first, last - first)
        else:
            position_fold(g, dP, dx, first, last)
        first = last
    if g.rows:
        unpad_image(g, pad, dx)


def conv_2d_back_input(const float[:, :, :, :] k not None, const float[:, :, :, :] gy not None,
                       float[:, :, :, ::1] dst not None, int s0, int s1, int p0, int p1,
                       int d0, int d1, int n_threads):
    """Gradient of :func:`conv_2d` with respect to its input.

    Parameters
    ----------
    k : (OC, IC, KH, KW) float32, any strides
    gy : (N, OC, OH, OW) float32, any strides: the output gradient
    dst : (N, IC, IH, IW) float32, C-contiguous, overwritten with, for every pixel, the sum
        over the taps that read it of ``k * gy``
    s0, s1, p0, p1, d0, d1, n_threads : int
        As for :func:`conv_2d`.
    """
    cdef str fn = "conv_2d_back_input"
    check_n_threads(fn, n_threads)
    cdef Geometry g
    _set_geometry(fn, &g, dst.shape[0], dst.shape[1], dst.shape[2], dst.shape[3], k.shape[0],
                  k.shape[2], k.shape[3], s0, s1, p0, p1, d0, d1)
    check_shape(fn, "k", k.shape, 2, g.OC, g.IC)
    check_shape(fn, "gy", gy.shape, 4, g.N, g.OC, g.OH, g.OW)
    cdef Py_ssize_t image = g.IC * g.IH * g.IW
    if g.N * image == 0:
        return
    cdef float* db = &dst[0, 0, 0, 0]
    if g.OC * g.M == 0:
        memset(db, 0, g.N * image * sizeof(float))
        return
    cdef const float[:, ::1] kmat = _kernel_matrix(k)
    cdef int team = <int>min(n_threads, g.N)
    cdef float[:, ::1] scratch = _scratch(&g, team)
    cdef Py_ssize_t per_thread = scratch.shape[1]
    cdef float* sb = &scratch[0, 0]
    cdef Image g0 = _image(gy)
    cdef Py_ssize_t sn = gy.strides[0], n
    cdef bint matrix = _is_matrix(g0, &g)
    cdef const float* kb = &kmat[0, 0]
    cdef bint k_finite = all_finite(kb, g.OC * g.KK)
    for n in prange(g.N, nogil=True, schedule="dynamic", num_threads=team,
                    use_threads_if=g.N * g.M * g.OC * g.KK >= MIN_PARALLEL_WORK):
        _back_input_image(&g, image_at(g0, n * sn), matrix, kb, k_finite, db + n * image,
                          sb + omp_get_thread_num() * per_thread)


cdef void _back_kernel_image(const Geometry* g, Image x, Image gy, bint matrix, float* dK,
                             bint accumulate, float* scratch) noexcept nogil:
    """``dK`` (OC, KK) = (or, with ``accumulate``, +=) the kernel gradient of one image."""
    cdef float* pad = scratch
    cdef float* P = scratch + g.pad_size
    cdef float* G = P + g.KK * g.chunk
    cdef const float* Gb = G
    cdef Py_ssize_t first, last
    cdef int cols, ldg, oc = <int>g.OC, kk = <int>g.KK
    cdef float one = 1.0
    cdef float beta = 1.0 if accumulate else 0.0
    cdef char no = b'N', tr = b'T'
    cdef bint finite = True
    if g.rows:
        finite = pad_image(g, x, pad)
    first = 0
    while first < g.units:
        last = min(first + g.per_block, g.units)
        if g.rows:
            row_patches(g, pad, P, first, last - first)
            if not finite:  # the junk columns meet zeros of G: inf * 0 would be NaN
                zero_junk(g, P, g.KK, last - first)
            rows_to_block(g, gy, G, first, last - first)
            cols = <int>((last - first) * g.PW)
            ldg = cols
        else:
            position_patches(g, x, P, first, last)
            Gb = position_rows(g, gy, matrix, first, last, G, &ldg)
            cols = <int>(last - first)
        # column-major: dK (KK, OC) (+)= P^T (KK, cols) * G (cols, OC)
        sgemm(&tr, &no, &kk, &oc, &cols, &one, P, &cols, <float*>Gb, &ldg, &beta, dK, &kk)
        beta = 1.0
        first = last


def conv_2d_back_kernel(const float[:, :, :, :] x not None, const float[:, :, :, :] gy not None,
                        float[:, :, :, ::1] dst not None, int s0, int s1, int p0, int p1,
                        int d0, int d1, int n_threads):
    """Gradient of :func:`conv_2d` with respect to its kernel.

    Parameters
    ----------
    x : (N, IC, IH, IW) float32, any strides: the forward input
    gy : (N, OC, OH, OW) float32, any strides: the output gradient
    dst : (OC, IC, KH, KW) float32, C-contiguous, overwritten with the sum over ``n, oh, ow``
        of ``gy[n, oc, oh, ow] * x[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]``
    s0, s1, p0, p1, d0, d1, n_threads : int
        As for :func:`conv_2d`.
    """
    cdef str fn = "conv_2d_back_kernel"
    check_n_threads(fn, n_threads)
    cdef Geometry g
    _set_geometry(fn, &g, x.shape[0], x.shape[1], x.shape[2], x.shape[3], dst.shape[0],
                  dst.shape[2], dst.shape[3], s0, s1, p0, p1, d0, d1)
    check_shape(fn, "dst", dst.shape, 2, g.OC, g.IC)
    check_shape(fn, "gy", gy.shape, 4, g.N, g.OC, g.OH, g.OW)
    cdef Py_ssize_t ksize = g.OC * g.KK
    if ksize == 0:
        return
    cdef float* db = &dst[0, 0, 0, 0]
    if g.N * g.M == 0:
        memset(db, 0, ksize * sizeof(float))
        return
    # image groups (the same for any thread count), each summed into its own partial
    cdef Py_ssize_t ngroups = max(1, min(g.N, MAX_KGRAD_GROUPS, PARTIALS_BUDGET // ksize))
    cdef float[:, ::1] partials = np.empty((ngroups, ksize), np.float32)
    cdef float* pb = &partials[0, 0]
    cdef int team = <int>min(n_threads, ngroups)
    cdef float[:, ::1] scratch = _scratch(&g, team)
    cdef Py_ssize_t per_thread = scratch.shape[1]
    cdef float* sb = &scratch[0, 0]
    cdef Image x0 = _image(x), g0 = _image(gy)
    cdef Py_ssize_t xsn = x.strides[0], gsn = gy.strides[0]
    cdef bint matrix = _is_matrix(g0, &g)
    cdef Py_ssize_t group, n, e
    for group in prange(ngroups, nogil=True, schedule="dynamic", num_threads=team,
                        use_threads_if=g.N * g.M * g.OC * g.KK >= MIN_PARALLEL_WORK):
        for n in range(g.N * group // ngroups, g.N * (group + 1) // ngroups):
            _back_kernel_image(&g, image_at(x0, n * xsn), image_at(g0, n * gsn), matrix,
                               pb + group * ksize, n > g.N * group // ngroups,
                               sb + omp_get_thread_num() * per_thread)
    # the partials in group order
    for e in range(ksize):
        db[e] = pb[e]
    for group in range(1, ngroups):
        for e in range(ksize):
            db[e] = db[e] + pb[group * ksize + e]
