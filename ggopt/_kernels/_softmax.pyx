"""Softmax along ne0 (the last NumPy axis), its backward, and the fused cross-entropy loss.

Each row is max-subtracted; exponentials are float32 (vectorized), their sums double like
ggml's ``ggml_float``. Rows are split evenly between threads. ``dst`` may be the same memory as
any input: each element of an input is read before the same element of dst is written.
"""

from libc.math cimport INFINITY, log

from ggopt._kernels._common cimport (
    Arr4,
    arr4_same_shape,
    arr4_set,
    arr4_shape_str,
    arr4_size,
    drive_elements,
    ggopt_expf,
)

from ggopt.errors import ShapeError

# Below this many element-operations a kernel stays on one thread; one exp counts as _EXP_COST.
cdef Py_ssize_t _PAR_MIN_WORK = 1 << 15
cdef Py_ssize_t _EXP_COST = 4
# Exponentials are computed in blocks of this many floats on the stack, then summed in double.
cdef enum:
    _BLOCK = 256


cdef struct Job:
    Arr4 x      # logits / softmax input / incoming gradient
    Arr4 y      # labels / softmax output
    Arr4 d      # dst
    float scale
    float grad


cdef inline const char *_row(const Arr4 *a, Py_ssize_t i3, Py_ssize_t i2,
                             Py_ssize_t i1) noexcept nogil:
    return a.data + i3 * a.s[0] + i2 * a.s[1] + i1 * a.s[2]


cdef inline float _at(const char *p, Py_ssize_t s, Py_ssize_t i) noexcept nogil:
    return (<const float *>(p + i * s))[0]


cdef inline double _sum_block(const float *b, Py_ssize_t n) noexcept nogil:
    """Sum of n contiguous floats in double (four partial sums)."""
    cdef double a0 = 0, a1 = 0, a2 = 0, a3 = 0
    cdef Py_ssize_t i = 0
    while i + 4 <= n:
        a0 += b[i]
        a1 += b[i + 1]
        a2 += b[i + 2]
        a3 += b[i + 3]
        i += 4
    while i < n:
        a0 += b[i]
        i += 1
    return (a0 + a1) + (a2 + a3)


cdef inline float _row_max(const char *x, Py_ssize_t xs, Py_ssize_t n, float scale) noexcept nogil:
    """max_i scale*x_i (ggml_vec_max_f32)."""
    cdef float m = -INFINITY, v
    cdef Py_ssize_t i
    for i in range(n):
        v = scale * _at(x, xs, i)
        m = m if m > v else v
    return m


cdef inline double _row_expsum(const char *x, Py_ssize_t xs, Py_ssize_t n, float scale,
                               float m) noexcept nogil:
    """sum_i exp(scale*x_i - m): the exps in float32, the sum in double."""
    cdef float buf[_BLOCK]
    cdef const float *fx
    cdef Py_ssize_t start = 0, k, i
    cdef double acc = 0
    while start < n:
        k = min(n - start, <Py_ssize_t>_BLOCK)
        if xs == 4:
            fx = <const float *>x + start
            for i in range(k):
                buf[i] = ggopt_expf(scale * fx[i] - m)
        else:
            for i in range(k):
                buf[i] = ggopt_expf(scale * _at(x, xs, start + i) - m)
        acc += _sum_block(buf, k)
        start += k
    return acc


cdef inline double _exp_into(const char *x, Py_ssize_t xs, char *d, Py_ssize_t ds,
                             Py_ssize_t n, float scale, float m) noexcept nogil:
    """d_i = exp(scale*x_i - m) in float32; returns their sum in double. d may be x."""
    cdef const float *fx = <const float *>x
    cdef float *fd = <float *>d
    cdef float e
    cdef double acc = 0
    cdef Py_ssize_t i
    if xs == 4 and ds == 4:
        for i in range(n):
            fd[i] = ggopt_expf(scale * fx[i] - m)
        return _sum_block(fd, n)
    for i in range(n):
        e = ggopt_expf(scale * _at(x, xs, i) - m)
        (<float *>(d + i * ds))[0] = e
        acc += e
    return acc


cdef Arr4 _rows_of(const float[:, :] m) noexcept:
    """A 2-D array as an Arr4 of shape (1, 1, rows, cols)."""
    cdef Arr4 a
    a.data = <char *>&m[0, 0]
    a.n[0] = 1
    a.n[1] = 1
    a.n[2] = m.shape[0]
    a.n[3] = m.shape[1]
    a.s[0] = 0
    a.s[1] = 0
    a.s[2] = m.strides[0]
    a.s[3] = m.strides[1]
    return a


cdef void _check_same(const Arr4 *a, const Arr4 *b, str fn, str an, str bn) except *:
    if not arr4_same_shape(a, b):
        raise ShapeError(f"{fn}: {bn} must have the shape of {an} {arr4_shape_str(a)}, "
                         f"got {arr4_shape_str(b)}")


cdef inline bint _par(const Arr4 *a, int n_threads) noexcept nogil:
    return n_threads > 1 and arr4_size(a) * _EXP_COST >= _PAR_MIN_WORK


cdef inline void _rows_shape(const Arr4 *a, Py_ssize_t *shape) noexcept nogil:
    # one element per row, so that drive_elements hands out whole rows
    shape[0] = a.n[0]
    shape[1] = a.n[1]
    shape[2] = a.n[2]
    shape[3] = 1


# ----------------------------------------------------------------------------------------------
# softmax

cdef void _soft_max_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                        Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Job *j = <Job *>ctx
    cdef const char *x = _row(&j.x, i3, i2, i1)
    cdef char *d = <char *>_row(&j.d, i3, i2, i1)
    cdef Py_ssize_t xs = j.x.s[3], ds = j.d.s[3], n = j.x.n[3], i
    cdef float m = _row_max(x, xs, n, j.scale)
    cdef float inv = <float>(1.0 / _exp_into(x, xs, d, ds, n, j.scale, m))
    cdef float *fd = <float *>d
    if ds == 4:
        for i in range(n):
            fd[i] = fd[i] * inv
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] *= inv


def soft_max(const float[:, :, :, :] a, float[:, :, :, :] dst, float scale, int n_threads):
    """``dst = softmax(scale*a)`` along the last axis, max-subtracted (ggml_soft_max_ext)."""
    cdef Job j
    cdef Py_ssize_t shape[4]
    arr4_set(&j.x, a)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.d, "soft_max (ggml_soft_max)", "a", "dst")
    j.scale = scale
    _rows_shape(&j.x, shape)
    if j.x.n[3] == 0:
        return
    with nogil:
        drive_elements(shape, _soft_max_row, &j, _par(&j.x, n_threads), n_threads)


cdef void _soft_max_back_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                             Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Job *j = <Job *>ctx
    cdef const char *g = _row(&j.x, i3, i2, i1)
    cdef const char *y = _row(&j.y, i3, i2, i1)
    cdef char *d = <char *>_row(&j.d, i3, i2, i1)
    cdef Py_ssize_t gs = j.x.s[3], ys = j.y.s[3], ds = j.d.s[3], n = j.x.n[3], i
    cdef const float *fg = <const float *>g
    cdef const float *fy = <const float *>y
    cdef float *fd = <float *>d
    cdef double a0 = 0, a1 = 0
    cdef float dot
    if gs == 4 and ys == 4 and ds == 4:
        i = 0
        while i + 2 <= n:
            a0 += <double>fg[i] * fy[i]
            a1 += <double>fg[i + 1] * fy[i + 1]
            i += 2
        if i < n:
            a0 += <double>fg[i] * fy[i]
        dot = <float>(a0 + a1)
        for i in range(n):
            fd[i] = (fg[i] - dot) * fy[i]
    else:
        for i in range(n):
            a0 += <double>_at(g, gs, i) * _at(y, ys, i)
        dot = <float>a0
        for i in range(n):
            (<float *>(d + i * ds))[0] = (_at(g, gs, i) - dot) * _at(y, ys, i)


def soft_max_back(const float[:, :, :, :] g, const float[:, :, :, :] y,
                  float[:, :, :, :] dst, int n_threads):
    """``dst = y * (g - sum(g*y))`` per row: the backward pass of softmax (ggml_soft_max_ext_back).

    ``g`` is the incoming gradient and ``y`` the softmax output; the dot product is in double.
    """
    cdef Job j
    cdef Py_ssize_t shape[4]
    arr4_set(&j.x, g)
    arr4_set(&j.y, y)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.y, "soft_max_back (ggml_soft_max_ext_back)", "g", "y")
    _check_same(&j.x, &j.d, "soft_max_back (ggml_soft_max_ext_back)", "g", "dst")
    _rows_shape(&j.x, shape)
    with nogil:
        drive_elements(shape, _soft_max_back_row, &j, _par(&j.x, n_threads), n_threads)


# ----------------------------------------------------------------------------------------------
# cross-entropy loss

cdef void _ce_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                  Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    # sum_i y_i * lsm_i with lsm_i = (x_i - max) - log(sum_k exp(x_k - max))
    cdef Job *j = <Job *>ctx
    cdef const char *x = _row(&j.x, 0, 0, i1)
    cdef const char *y = _row(&j.y, 0, 0, i1)
    cdef Py_ssize_t xs = j.x.s[3], ys = j.y.s[3], n = j.x.n[3], i
    cdef float m = _row_max(x, xs, n, 1)
    cdef float lsum = <float>log(_row_expsum(x, xs, n, 1, m))
    cdef const float *fx = <const float *>x
    cdef const float *fy = <const float *>y
    cdef double a0 = 0, a1 = 0
    if xs == 4 and ys == 4:
        i = 0
        while i + 2 <= n:
            a0 += fy[i] * ((fx[i] - m) - lsum)
            a1 += fy[i + 1] * ((fx[i + 1] - m) - lsum)
            i += 2
        if i < n:
            a0 += fy[i] * ((fx[i] - m) - lsum)
    else:
        for i in range(n):
            a0 += _at(y, ys, i) * ((_at(x, xs, i) - m) - lsum)
    acc[0] += a0 + a1


cdef void _prepare_ce(Job *j, const float[:, :] logits, const float[:, :] labels,
                      str fn) except *:
    j.x = _rows_of(logits)
    j.y = _rows_of(labels)
    _check_same(&j.x, &j.y, fn, "logits", "labels")


def cross_entropy_loss(const float[:, :] logits, const float[:, :] labels, int n_threads):
    """Mean over rows of ``-sum(labels * log_softmax(logits))`` (ggml_cross_entropy_loss).

    Arrays are (nrows, ncols). Exponentials in float32, sums in double; the result is returned
    rounded to float32.
    """
    cdef Job j
    cdef Py_ssize_t shape[4]
    cdef Py_ssize_t nrows = logits.shape[0]
    cdef double total
    _prepare_ce(&j, logits, labels, "cross_entropy_loss (ggml_cross_entropy_loss)")
    if nrows == 0:
        raise ShapeError("cross_entropy_loss (ggml_cross_entropy_loss): logits has no rows")
    _rows_shape(&j.x, shape)
    with nogil:
        total = drive_elements(shape, _ce_row, &j, _par(&j.x, n_threads), n_threads)
    return <float>(-total / nrows)


cdef void _ce_back_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                       Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    # dst_i = (softmax(x)_i - y_i) * grad/nrows. The exps go to dst first, unless dst is the
    # labels' memory: then they are recomputed in the write pass.
    cdef Job *j = <Job *>ctx
    cdef const char *x = _row(&j.x, 0, 0, i1)
    cdef const char *y = _row(&j.y, 0, 0, i1)
    cdef char *d = <char *>_row(&j.d, 0, 0, i1)
    cdef Py_ssize_t xs = j.x.s[3], ys = j.y.s[3], ds = j.d.s[3], n = j.x.n[3], i
    cdef float m = _row_max(x, xs, n, 1)
    cdef float inv, g = j.grad
    cdef const float *fy = <const float *>y
    cdef float *fd = <float *>d
    if d == y:
        inv = <float>(1.0 / _row_expsum(x, xs, n, 1, m))
        for i in range(n):
            (<float *>(d + i * ds))[0] = (
                (ggopt_expf(_at(x, xs, i) - m) * inv - _at(y, ys, i)) * g
            )
        return
    inv = <float>(1.0 / _exp_into(x, xs, d, ds, n, 1, m))
    if ys == 4 and ds == 4:
        for i in range(n):
            fd[i] = (fd[i] * inv - fy[i]) * g
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = ((<float *>(d + i * ds))[0] * inv - _at(y, ys, i)) * g


def cross_entropy_loss_back(float grad, const float[:, :] logits, const float[:, :] labels,
                            float[:, :] dst, int n_threads):
    """``dst = (softmax(logits) - labels) * (grad / nrows)`` (ggml_cross_entropy_loss_back).

    ``grad`` is the incoming gradient of the (scalar) loss; one fused pass per row.
    """
    cdef Job j
    cdef Py_ssize_t shape[4]
    cdef Py_ssize_t nrows = logits.shape[0]
    _prepare_ce(&j, logits, labels, "cross_entropy_loss_back (ggml_cross_entropy_loss_back)")
    j.d = _rows_of(dst)
    _check_same(&j.x, &j.d, "cross_entropy_loss_back (ggml_cross_entropy_loss_back)",
                "logits", "dst")
    if nrows == 0:
        return
    j.grad = grad / <float>nrows
    _rows_shape(&j.x, shape)
    with nogil:
        drive_elements(shape, _ce_back_row, &j, _par(&j.x, n_threads), n_threads)
