"""Row normalizations along ne0 (the last NumPy axis) and their gradients: rms_norm, norm.

Sums are double (ggml's ``ggml_float``), the per-row scale is float32 like ggml's. Arrays are
4-D in NumPy order with any byte strides; rows are split evenly between threads, so a row's
result never depends on the thread count. ``dst`` may be the memory of an input: every pass
reads an element before it writes the same element, and the write pass comes last.
"""

from ggopt._kernels._common cimport (
    check_n_threads,
    Arr4,
    arr4_same_shape,
    arr4_set,
    arr4_shape_str,
    arr4_size,
    drive_elements,
)

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

cdef extern from *:
    """
    #define GGOPT_AT(p, s, i) (*(const float *)((const char *)(p) + (i) * (s)))
    #define GGOPT_AT_W(p, s, i) (*(float *)((char *)(p) + (i) * (s)))

    /* sum_i x_i * y_i in double; contiguous rows take four independent partial sums. */
    GGOPT_ROW_INLINE double ggopt_norm_dot(const char *x, Py_ssize_t xs, const char *y,
                                           Py_ssize_t ys, Py_ssize_t n) {
        double a[4] = {0, 0, 0, 0};
        Py_ssize_t i = 0;
        if (xs == 4 && ys == 4) {
            const float *fx = (const float *)x, *fy = (const float *)y;
            for (; i + 4 <= n; i += 4)
                for (int k = 0; k < 4; k++) a[k] += (double)fx[i + k] * (double)fy[i + k];
        }
        for (; i < n; i++) a[0] += (double)GGOPT_AT(x, xs, i) * (double)GGOPT_AT(y, ys, i);
        return (a[0] + a[1]) + (a[2] + a[3]);
    }

    GGOPT_ROW_INLINE double ggopt_norm_sum(const char *x, Py_ssize_t xs, Py_ssize_t n) {
        double a[4] = {0, 0, 0, 0};
        Py_ssize_t i = 0;
        if (xs == 4) {
            const float *fx = (const float *)x;
            for (; i + 4 <= n; i += 4)
                for (int k = 0; k < 4; k++) a[k] += (double)fx[i + k];
        }
        for (; i < n; i++) a[0] += (double)GGOPT_AT(x, xs, i);
        return (a[0] + a[1]) + (a[2] + a[3]);
    }

    /* sum_i (x_i - m)^2 in double, the difference rounded to float32 as ggml does. */
    GGOPT_ROW_INLINE double ggopt_norm_var_sum(const char *x, Py_ssize_t xs, Py_ssize_t n,
                                               float m) {
        double a[4] = {0, 0, 0, 0};
        Py_ssize_t i = 0;
        if (xs == 4) {
            const float *fx = (const float *)x;
            for (; i + 4 <= n; i += 4)
                for (int k = 0; k < 4; k++) {
                    float v = fx[i + k] - m;
                    a[k] += (double)(v * v);
                }
        }
        for (; i < n; i++) {
            float v = GGOPT_AT(x, xs, i) - m;
            a[0] += (double)(v * v);
        }
        return (a[0] + a[1]) + (a[2] + a[3]);
    }

    /* sum_i (x_i - m) * y_i in double, the difference rounded to float32. */
    GGOPT_ROW_INLINE double ggopt_norm_cdot(const char *x, Py_ssize_t xs, const char *y,
                                            Py_ssize_t ys, Py_ssize_t n, float m) {
        double a[4] = {0, 0, 0, 0};
        Py_ssize_t i = 0;
        if (xs == 4 && ys == 4) {
            const float *fx = (const float *)x, *fy = (const float *)y;
            for (; i + 4 <= n; i += 4)
                for (int k = 0; k < 4; k++) a[k] += (double)(fx[i + k] - m) * (double)fy[i + k];
        }
        for (; i < n; i++) a[0] += (double)(GGOPT_AT(x, xs, i) - m) * (double)GGOPT_AT(y, ys, i);
        return (a[0] + a[1]) + (a[2] + a[3]);
    }

    /* d_i = (x_i - m) * s + c * y_i over a row (y may be NULL when c == 0). */
    GGOPT_ROW_INLINE void ggopt_norm_write(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                                           const char *y, Py_ssize_t ys, Py_ssize_t n,
                                           float m, float s, float c) {
        if (ds == 4 && xs == 4 && (y == NULL || ys == 4)) {
            float *fd = (float *)d;
            const float *fx = (const float *)x, *fy = (const float *)y;
            if (y == NULL)
                for (Py_ssize_t i = 0; i < n; i++) fd[i] = (fx[i] - m) * s;
            else
                for (Py_ssize_t i = 0; i < n; i++) fd[i] = (fx[i] - m) * s + c * fy[i];
            return;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = (GGOPT_AT(x, xs, i) - m) * s;
            if (y != NULL) v += c * GGOPT_AT(y, ys, i);
            GGOPT_AT_W(d, ds, i) = v;
        }
    }

    /* rms_norm: d = x / sqrt(mean(x^2) + eps) */
    GGOPT_MULTIVERSION
    static void ggopt_rms_norm_row(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                                   Py_ssize_t n, float eps) {
        float mean = (float)(ggopt_norm_dot(x, xs, x, xs, n) / (double)n);
        float s = 1.0f / sqrtf(mean + eps);
        ggopt_norm_write(d, ds, x, xs, NULL, 0, n, 0.0f, s, 0.0f);
    }

    /* rms_norm's gradient: with r = 1/sqrt(mean(x^2) + eps),
       dx = r * (dy - x * sum(x*dy) / (sum(x^2) + n*eps)). */
    GGOPT_MULTIVERSION
    static void ggopt_rms_norm_back_row(char *d, Py_ssize_t ds, const char *g, Py_ssize_t gs,
                                        const char *x, Py_ssize_t xs, Py_ssize_t n, float eps) {
        double sxx = ggopt_norm_dot(x, xs, x, xs, n);
        double sxg = ggopt_norm_dot(x, xs, g, gs, n);
        float r = 1.0f / sqrtf((float)(sxx / (double)n) + eps);
        float c = (float)(-sxg / (sxx + (double)eps * (double)n));
        /* d = (g + c*x) * r, written as (g - 0)*r + (c*r)*x */
        ggopt_norm_write(d, ds, g, gs, x, xs, n, 0.0f, r, c * r);
    }

    /* norm: d = (x - mean(x)) / sqrt(var(x) + eps) */
    GGOPT_MULTIVERSION
    static void ggopt_norm_row(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                               Py_ssize_t n, float eps) {
        float m = (float)(ggopt_norm_sum(x, xs, n) / (double)n);
        float var = (float)(ggopt_norm_var_sum(x, xs, n, m) / (double)n);
        float s = 1.0f / sqrtf(var + eps);
        ggopt_norm_write(d, ds, x, xs, NULL, 0, n, m, s, 0.0f);
    }

    /* norm's gradient: with xh = (x - mean) * r and r = 1/sqrt(var + eps),
       dx = r * (dy - mean(dy) - xh * mean(dy * xh))
          = r*dy - r^3 * mean(dy*(x - mean)) * (x - mean) - r*mean(dy). */
    GGOPT_MULTIVERSION
    static void ggopt_norm_back_row(char *d, Py_ssize_t ds, const char *g, Py_ssize_t gs,
                                    const char *x, Py_ssize_t xs, Py_ssize_t n, float eps) {
        double dn = (double)n;
        float m = (float)(ggopt_norm_sum(x, xs, n) / dn);
        float var = (float)(ggopt_norm_var_sum(x, xs, n, m) / dn);
        double r = 1.0 / sqrt((double)(var + eps));
        double mg = ggopt_norm_sum(g, gs, n) / dn;
        double mxg = ggopt_norm_cdot(x, xs, g, gs, n, m) / dn;  /* mean(dy * (x - mean)) */
        float a = (float)r;
        float c = (float)(-mxg * r * r * r);
        float off = (float)(-r * mg);
        if (ds == 4 && gs == 4 && xs == 4) {
            float *fd = (float *)d;
            const float *fg = (const float *)g, *fx = (const float *)x;
            for (Py_ssize_t i = 0; i < n; i++) fd[i] = (a * fg[i] + c * (fx[i] - m)) + off;
            return;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            GGOPT_AT_W(d, ds, i) = (a * GGOPT_AT(g, gs, i) + c * (GGOPT_AT(x, xs, i) - m)) + off;
    }
    """
    void ggopt_rms_norm_row(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                            Py_ssize_t n, float eps) noexcept nogil
    void ggopt_rms_norm_back_row(char *d, Py_ssize_t ds, const char *g, Py_ssize_t gs,
                                 const char *x, Py_ssize_t xs, Py_ssize_t n,
                                 float eps) noexcept nogil
    void ggopt_norm_row(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                        Py_ssize_t n, float eps) noexcept nogil
    void ggopt_norm_back_row(char *d, Py_ssize_t ds, const char *g, Py_ssize_t gs,
                             const char *x, Py_ssize_t xs, Py_ssize_t n,
                             float eps) noexcept nogil

# Below this many element-operations a kernel stays on one thread.
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)
# Element-operations per element of a row (two or three passes over it).
cdef Py_ssize_t _ROW_COST = 3

cdef enum Kind:
    RMS_NORM
    RMS_NORM_BACK
    NORM
    NORM_BACK


cdef struct Job:
    Arr4 x      # the forward input
    Arr4 g      # the output gradient (backward kinds)
    Arr4 d      # dst
    float eps
    Kind kind


cdef inline char *_row(const Arr4 *a, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1) noexcept nogil:
    return a.data + i3 * a.s[0] + i2 * a.s[1] + i1 * a.s[2]


cdef void _norm_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                    Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Job *j = <Job *>ctx
    cdef char *x = _row(&j.x, i3, i2, i1)
    cdef char *d = _row(&j.d, i3, i2, i1)
    cdef Py_ssize_t n = j.x.n[3]
    if j.kind == RMS_NORM:
        ggopt_rms_norm_row(d, j.d.s[3], x, j.x.s[3], n, j.eps)
    elif j.kind == NORM:
        ggopt_norm_row(d, j.d.s[3], x, j.x.s[3], n, j.eps)
    elif j.kind == RMS_NORM_BACK:
        ggopt_rms_norm_back_row(d, j.d.s[3], _row(&j.g, i3, i2, i1), j.g.s[3], x, j.x.s[3], n,
                                j.eps)
    else:
        ggopt_norm_back_row(d, j.d.s[3], _row(&j.g, i3, i2, i1), j.g.s[3], x, j.x.s[3], n,
                            j.eps)


cdef void _check_same(const Arr4 *a, const Arr4 *b, str fn, str bn) except *:
    if not arr4_same_shape(a, b):
        raise ShapeError(f"{fn}: {bn} must have the shape of x {arr4_shape_str(a)}, "
                         f"got {arr4_shape_str(b)}")


cdef void _run(Job *j, int n_threads) noexcept:
    cdef Py_ssize_t shape[4]
    shape[0] = j.x.n[0]
    shape[1] = j.x.n[1]
    shape[2] = j.x.n[2]
    shape[3] = 1  # one element per row: drive_elements hands out whole rows
    if j.x.n[3] == 0:
        return
    cdef bint par = n_threads > 1 and arr4_size(&j.x) * _ROW_COST >= _PAR_MIN_WORK
    with nogil:
        drive_elements(shape, _norm_row, j, par, n_threads)


cdef void _forward(Kind kind, str fn, const float[:, :, :, :] x, float[:, :, :, :] dst,
                   float eps, int n_threads) except *:
    cdef Job j
    arr4_set(&j.x, x)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.d, fn, "dst")
    j.eps = eps
    j.kind = kind
    _run(&j, n_threads)


cdef void _backward(Kind kind, str fn, const float[:, :, :, :] g, const float[:, :, :, :] x,
                    float[:, :, :, :] dst, float eps, int n_threads) except *:
    cdef Job j
    arr4_set(&j.x, x)
    arr4_set(&j.g, g)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.g, fn, "the gradient")
    _check_same(&j.x, &j.d, fn, "dst")
    j.eps = eps
    j.kind = kind
    _run(&j, n_threads)


def rms_norm(const float[:, :, :, :] x not None, float[:, :, :, :] dst not None, float eps,
             int n_threads):
    """``dst = x / sqrt(mean(x**2) + eps)`` per row (ggml_rms_norm)."""
    check_n_threads("rms_norm", n_threads)
    _forward(RMS_NORM, "rms_norm (ggml_rms_norm)", x, dst, eps, n_threads)


def rms_norm_back(const float[:, :, :, :] g not None, const float[:, :, :, :] x not None,
                  float[:, :, :, :] dst not None, float eps, int n_threads):
    """The gradient of :func:`rms_norm` w.r.t. ``x`` given the output gradient ``g``
    (ggml_rms_norm_back)."""
    check_n_threads("rms_norm_back", n_threads)
    _backward(RMS_NORM_BACK, "rms_norm_back (ggml_rms_norm_back)", g, x, dst, eps, n_threads)


def norm(const float[:, :, :, :] x not None, float[:, :, :, :] dst not None, float eps,
         int n_threads):
    """``dst = (x - mean(x)) / sqrt(var(x) + eps)`` per row, biased variance (ggml_norm)."""
    check_n_threads("norm", n_threads)
    _forward(NORM, "norm (ggml_norm)", x, dst, eps, n_threads)


def norm_back(const float[:, :, :, :] g not None, const float[:, :, :, :] x not None,
              float[:, :, :, :] dst not None, float eps, int n_threads):
    """The gradient of :func:`norm` w.r.t. ``x`` given the output gradient ``g``."""
    check_n_threads("norm_back", n_threads)
    _backward(NORM_BACK, "norm_back", g, x, dst, eps, n_threads)
