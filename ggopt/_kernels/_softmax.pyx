"""Softmax along ne0 (the last NumPy axis), its backward, and the fused cross-entropy loss.

Each row is max-subtracted; exponentials are float32 (vectorized), their sums double like
ggml's ``ggml_float``. Rows are split evenly between threads. ``dst`` may be the same memory as
any input: each element of an input is read before the same element of dst is written.
Contiguous rows go through the C row loops below (built twice, see GGOPT_MULTIVERSION);
strided rows through the general loops.
"""

from cython.parallel cimport prange
from libc.math cimport INFINITY, log

from ggopt._kernels._common cimport (
    check_n_threads,
    Arr4,
    arr4_same_shape,
    arr4_set,
    arr4_shape_str,
    arr4_size,
    drive_elements,
    ggopt_expf,
)

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

cdef extern from "_softmax_rows.h" nogil:
    pass

cdef extern from *:
    """
    /* sum_i y[i] * ((x[i] - m) - lsum) in double over contiguous rows: a row's contribution to
       the cross-entropy sum, log-softmax computed in float32 like ggml. */
    GGOPT_ROW_INLINE double ggopt_row_ce(const float *x, const float *y, Py_ssize_t n,
                                         float m, float lsum) {
        double a[4] = {0, 0, 0, 0};
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4)
            for (int k = 0; k < 4; k++) a[k] += (double)(y[i + k] * ((x[i + k] - m) - lsum));
        for (; i < n; i++) a[0] += (double)(y[i] * ((x[i] - m) - lsum));
        return (a[0] + a[1]) + (a[2] + a[3]);
    }

    /* softmax(s*x) over one contiguous row into d (d may be x). */
    GGOPT_MULTIVERSION
    static void ggopt_softmax_row(float *d, const float *x, Py_ssize_t n, float s) {
        float m = ggopt_row_max(x, n, s);
        float inv = (float)(1.0 / ggopt_row_exp(d, x, n, s, m));
        for (Py_ssize_t i = 0; i < n; i++) d[i] *= inv;
    }

    /* s * y * (g - sum(g*y)) over one contiguous row into d (d may be g or y). */
    GGOPT_MULTIVERSION
    static void ggopt_softmax_back_row(float *d, const float *g, const float *y, Py_ssize_t n,
                                       float s) {
        double a[4] = {0, 0, 0, 0};
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4)
            for (int k = 0; k < 4; k++) a[k] += (double)g[i + k] * (double)y[i + k];
        for (; i < n; i++) a[0] += (double)g[i] * (double)y[i];
        float dot = (float)((a[0] + a[1]) + (a[2] + a[3]));
        for (i = 0; i < n; i++) d[i] = ((g[i] - dot) * y[i]) * s;
    }

    /* Short rows (10 classes) are taken a block at a time: x - max of every row of the block
       goes to one buffer and one vectorized loop takes all the exps, instead of a short loop
       per row whose scalar tail costs as much as its vector part. */
    #define GGOPT_CE_BLOCK 2048
    #define GGOPT_CE_SHORT_ROW 256

    /* From row r on, as many rows as fit a block: st = x - max (per row), e = exp(st).
       Returns the row after the block. Needs n <= GGOPT_CE_BLOCK. */
    GGOPT_ROW_INLINE Py_ssize_t ggopt_ce_block(const char *x, Py_ssize_t xr, Py_ssize_t r,
                                               Py_ssize_t nrows, Py_ssize_t n, float *st,
                                               float *e) {
        Py_ssize_t r1 = r + GGOPT_CE_BLOCK / n, k = 0;
        if (r1 > nrows) r1 = nrows;
        for (Py_ssize_t q = r; q < r1; q++, k += n) {
            const float *xp = (const float *)(x + q * xr);
            float m = ggopt_row_max(xp, n, 1.0f);
            for (Py_ssize_t i = 0; i < n; i++) st[k + i] = xp[i] - m;
        }
        for (Py_ssize_t i = 0; i < k; i++) e[i] = ggopt_expf(st[i]);
        return r1;
    }

    /* sum over nrows contiguous rows (byte strides xr, yr) of sum_i y_i * lsm_i, where
       lsm_i = (x_i - max) - log(sum exp(x - max)) in float32 (ggml_cross_entropy_loss). The
       log and the reciprocals below are float32 (ggml takes them in double and rounds): at
       most an ulp apart, and a row of 10 classes is short enough for it to show in the time. */
    GGOPT_MULTIVERSION
    static double ggopt_ce_rows(const char *x, Py_ssize_t xr, const char *y, Py_ssize_t yr,
                                Py_ssize_t nrows, Py_ssize_t n) {
        double total = 0;
        if (n <= GGOPT_CE_SHORT_ROW) {
            float st[GGOPT_CE_BLOCK], e[GGOPT_CE_BLOCK];
            for (Py_ssize_t r = 0, r1; r < nrows; r = r1) {
                r1 = ggopt_ce_block(x, xr, r, nrows, n, st, e);
                for (Py_ssize_t q = r, k = 0; q < r1; q++, k += n) {
                    float lsum = logf((float)ggopt_row_sum_d(e + k, n));
                    total += ggopt_row_ce(st + k, (const float *)(y + q * yr), n, 0.0f, lsum);
                }
            }
            return total;
        }
        for (Py_ssize_t r = 0; r < nrows; r++) {
            const float *xp = (const float *)(x + r * xr);
            const float *yp = (const float *)(y + r * yr);
            float m = ggopt_row_max(xp, n, 1.0f);
            float lsum = logf((float)ggopt_row_expsum(xp, n, 1.0f, m));
            total += ggopt_row_ce(xp, yp, n, m, lsum);
        }
        return total;
    }

    /* d = (softmax(x) - y) * g over nrows contiguous rows. Long rows park their exps in d,
       except when d is y's memory: then they are computed again in the write pass. */
    GGOPT_MULTIVERSION
    static void ggopt_ce_back_rows(const char *x, Py_ssize_t xr, const char *y, Py_ssize_t yr,
                                   char *d, Py_ssize_t dr, Py_ssize_t nrows, Py_ssize_t n,
                                   float g) {
        if (n <= GGOPT_CE_SHORT_ROW) {
            float st[GGOPT_CE_BLOCK], e[GGOPT_CE_BLOCK];
            for (Py_ssize_t r = 0, r1; r < nrows; r = r1) {
                r1 = ggopt_ce_block(x, xr, r, nrows, n, st, e);
                for (Py_ssize_t q = r, k = 0; q < r1; q++, k += n) {
                    const float *yp = (const float *)(y + q * yr);
                    float *dp = (float *)(d + q * dr);
                    float inv = 1.0f / (float)ggopt_row_sum_d(e + k, n);
                    for (Py_ssize_t i = 0; i < n; i++) dp[i] = (e[k + i] * inv - yp[i]) * g;
                }
            }
            return;
        }
        for (Py_ssize_t r = 0; r < nrows; r++) {
            const float *xp = (const float *)(x + r * xr);
            const float *yp = (const float *)(y + r * yr);
            float *dp = (float *)(d + r * dr);
            float m = ggopt_row_max(xp, n, 1.0f);
            if ((const float *)dp == yp) {
                float inv = 1.0f / (float)ggopt_row_expsum(xp, n, 1.0f, m);
                for (Py_ssize_t i = 0; i < n; i++)
                    dp[i] = (ggopt_expf(xp[i] - m) * inv - yp[i]) * g;
            } else {
                float inv = 1.0f / (float)ggopt_row_exp(dp, xp, n, 1.0f, m);
                for (Py_ssize_t i = 0; i < n; i++) dp[i] = (dp[i] * inv - yp[i]) * g;
            }
        }
    }
    """
    void ggopt_softmax_row(float *d, const float *x, Py_ssize_t n, float s) noexcept nogil
    void ggopt_softmax_back_row(float *d, const float *g, const float *y, Py_ssize_t n,
                                float s) noexcept nogil
    double ggopt_ce_rows(const char *x, Py_ssize_t xr, const char *y, Py_ssize_t yr,
                         Py_ssize_t nrows, Py_ssize_t n) noexcept nogil
    void ggopt_ce_back_rows(const char *x, Py_ssize_t xr, const char *y, Py_ssize_t yr,
                            char *d, Py_ssize_t dr, Py_ssize_t nrows, Py_ssize_t n,
                            float g) noexcept nogil

# Below this many element-operations a kernel stays on one thread; one exp counts as _EXP_COST.
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)
cdef Py_ssize_t _EXP_COST = 16


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


# ----------------------------------------------------------------------------------------------
# general (strided) rows

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
    cdef double acc = 0
    cdef Py_ssize_t i
    for i in range(n):
        acc += ggopt_expf(scale * _at(x, xs, i) - m)
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
    cdef float s = j.scale, m, inv, e
    cdef double total = 0
    if xs == 4 and ds == 4:
        ggopt_softmax_row(<float *>d, <const float *>x, n, s)
        return
    m = _row_max(x, xs, n, s)
    for i in range(n):
        e = ggopt_expf(s * _at(x, xs, i) - m)
        (<float *>(d + i * ds))[0] = e
        total += e
    inv = <float>(1.0 / total)
    for i in range(n):
        (<float *>(d + i * ds))[0] *= inv


def soft_max(const float[:, :, :, :] a not None, float[:, :, :, :] dst not None, float scale,
             int n_threads):
    """``dst = softmax(scale*a)`` along the last axis, max-subtracted (ggml_soft_max_ext)."""
    check_n_threads("soft_max", n_threads)
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
    cdef double a0 = 0
    cdef float dot, sc = j.scale
    if gs == 4 and ys == 4 and ds == 4:
        ggopt_softmax_back_row(<float *>d, <const float *>g, <const float *>y, n, sc)
    else:
        for i in range(n):
            a0 += <double>_at(g, gs, i) * _at(y, ys, i)
        dot = <float>a0
        for i in range(n):
            (<float *>(d + i * ds))[0] = ((_at(g, gs, i) - dot) * _at(y, ys, i)) * sc


def soft_max_back(const float[:, :, :, :] g not None, const float[:, :, :, :] y not None,
                  float[:, :, :, :] dst not None, float scale, int n_threads):
    """``dst = scale * y * (g - sum(g*y))`` per row: the backward pass of
    ``softmax(scale*a + mask)`` w.r.t. ``a`` (ggml_soft_max_ext_back).

    ``g`` is the incoming gradient and ``y`` the softmax output; the dot product is in double.
    """
    check_n_threads("soft_max_back", n_threads)
    cdef Job j
    cdef Py_ssize_t shape[4]
    arr4_set(&j.x, g)
    arr4_set(&j.y, y)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.y, "soft_max_back (ggml_soft_max_ext_back)", "g", "y")
    _check_same(&j.x, &j.d, "soft_max_back (ggml_soft_max_ext_back)", "g", "dst")
    j.scale = scale
    _rows_shape(&j.x, shape)
    with nogil:
        drive_elements(shape, _soft_max_back_row, &j, _par(&j.x, n_threads), n_threads)


# ----------------------------------------------------------------------------------------------
# cross-entropy loss

cdef void _ce_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                  Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    # strided rows: sum_i y_i * ((x_i - max) - log(sum_k exp(x_k - max)))
    cdef Job *j = <Job *>ctx
    cdef const char *x = _row(&j.x, 0, 0, i1)
    cdef const char *y = _row(&j.y, 0, 0, i1)
    cdef Py_ssize_t xs = j.x.s[3], ys = j.y.s[3], n = j.x.n[3], i
    cdef float m = _row_max(x, xs, n, 1)
    cdef float lsum = <float>log(_row_expsum(x, xs, n, 1, m))
    cdef double a0 = 0
    for i in range(n):
        a0 += _at(y, ys, i) * ((_at(x, xs, i) - m) - lsum)
    acc[0] += a0


cdef void _ce_back_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                       Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    # strided rows: the exps are computed twice so that dst may alias logits or labels
    cdef Job *j = <Job *>ctx
    cdef const char *x = _row(&j.x, 0, 0, i1)
    cdef const char *y = _row(&j.y, 0, 0, i1)
    cdef char *d = <char *>_row(&j.d, 0, 0, i1)
    cdef Py_ssize_t xs = j.x.s[3], ys = j.y.s[3], ds = j.d.s[3], n = j.x.n[3], i
    cdef float m = _row_max(x, xs, n, 1)
    cdef float inv = <float>(1.0 / _row_expsum(x, xs, n, 1, m))
    cdef float g = j.grad
    for i in range(n):
        (<float *>(d + i * ds))[0] = (ggopt_expf(_at(x, xs, i) - m) * inv - _at(y, ys, i)) * g


cdef void _prepare_ce(Job *j, const float[:, :] logits, const float[:, :] labels,
                      str fn) except *:
    j.x = _rows_of(logits)
    j.y = _rows_of(labels)
    _check_same(&j.x, &j.y, fn, "logits", "labels")


def cross_entropy_loss(const float[:, :] logits not None, const float[:, :] labels not None,
                       int n_threads):
    """Mean over rows of ``-sum(labels * log_softmax(logits))`` (ggml_cross_entropy_loss).

    Arrays are (nrows, ncols). Exponentials in float32, sums in double; the result is returned
    rounded to float32.
    """
    check_n_threads("cross_entropy_loss", n_threads)
    cdef Job j
    cdef Py_ssize_t shape[4]
    cdef Py_ssize_t nrows = logits.shape[0], ncols = logits.shape[1], nr, k, r0, r1
    cdef double total = 0
    cdef bint par
    _prepare_ce(&j, logits, labels, "cross_entropy_loss (ggml_cross_entropy_loss)")
    if nrows == 0:
        raise ShapeError("cross_entropy_loss (ggml_cross_entropy_loss): logits has no rows")
    par = _par(&j.x, n_threads)
    if j.x.s[3] != 4 or j.y.s[3] != 4:
        _rows_shape(&j.x, shape)
        with nogil:
            total = drive_elements(shape, _ce_row, &j, par, n_threads)
        return <float>(-total / nrows)
    if not par:  # no OpenMP region at all (see drive_elements)
        with nogil:
            total = ggopt_ce_rows(j.x.data, j.x.s[2], j.y.data, j.y.s[2], nrows, ncols)
        return <float>(-total / nrows)
    nr = n_threads
    for k in prange(nr, nogil=True, num_threads=n_threads, schedule="static"):
        r0 = nrows * k // nr
        r1 = nrows * (k + 1) // nr
        total += ggopt_ce_rows(j.x.data + r0 * j.x.s[2], j.x.s[2], j.y.data + r0 * j.y.s[2],
                               j.y.s[2], r1 - r0, ncols)
    return <float>(-total / nrows)


def cross_entropy_loss_back(float grad, const float[:, :] logits not None,
                            const float[:, :] labels not None, float[:, :] dst not None,
                            int n_threads):
    """``dst = (softmax(logits) - labels) * (grad / nrows)`` (ggml_cross_entropy_loss_back).

    ``grad`` is the incoming gradient of the (scalar) loss; one fused pass per row.
    """
    check_n_threads("cross_entropy_loss_back", n_threads)
    cdef Job j
    cdef Py_ssize_t shape[4]
    cdef Py_ssize_t nrows = logits.shape[0], ncols = logits.shape[1], nr, k, r0, r1
    cdef bint par
    _prepare_ce(&j, logits, labels, "cross_entropy_loss_back (ggml_cross_entropy_loss_back)")
    j.d = _rows_of(dst)
    _check_same(&j.x, &j.d, "cross_entropy_loss_back (ggml_cross_entropy_loss_back)",
                "logits", "dst")
    if nrows == 0:
        return
    j.grad = grad / <float>nrows
    par = _par(&j.x, n_threads)
    if j.x.s[3] != 4 or j.y.s[3] != 4 or j.d.s[3] != 4:
        _rows_shape(&j.x, shape)
        with nogil:
            drive_elements(shape, _ce_back_row, &j, par, n_threads)
        return
    if not par:  # no OpenMP region at all (see drive_elements)
        with nogil:
            ggopt_ce_back_rows(j.x.data, j.x.s[2], j.y.data, j.y.s[2], j.d.data, j.d.s[2], nrows,
                               ncols, j.grad)
        return
    nr = n_threads
    for k in prange(nr, nogil=True, num_threads=n_threads, schedule="static"):
        r0 = nrows * k // nr
        r1 = nrows * (k + 1) // nr
        ggopt_ce_back_rows(j.x.data + r0 * j.x.s[2], j.x.s[2], j.y.data + r0 * j.y.s[2],
                           j.y.s[2], j.d.data + r0 * j.d.s[2], j.d.s[2], r1 - r0, ncols,
                           j.grad)
