"""Attention masks: softmax with a scale, an additive mask and ALiBi slopes
(ggml_soft_max_ext), and the causal masks diag_mask_inf / diag_mask_zero.

Arrays are 4-D in NumPy order ``(ne3, ne2, ne1, ne0)`` with any byte strides. The softmax mask
has its own shape ``(m3, m2, m1, ne0)``: row ``i1`` of the input uses mask row ``i1``
(``m1 >= ne1``) of mask matrix ``(i3 % m3, i2 % m2)``, ggml's broadcast. Rows are split evenly
between threads (results do not depend on the thread count); exponentials are float32, their
sums double. ``dst`` may be the memory of ``a`` (or of a mask of a's shape): every element is
read before the same element is written.
"""

from ggopt._kernels._common cimport (
    Arr4,
    arr4_set,
    arr4_size,
    check_n_threads,
    drive_elements,
)

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

cdef extern from *:
    """
    #include <string.h>

    #define GGOPT_AAT(p, s, i) (*(const float *)((const char *)(p) + (i) * (s)))

    #if defined(__GNUC__)
    typedef float ggopt_att_f8 __attribute__((vector_size(32)));
    typedef int32_t ggopt_att_i8 __attribute__((vector_size(32)));

    /* The row length after dropping the masked-out tail (s*x + slope*m == -inf), eight
       elements at a time while all eight are -inf, then one at a time. */
    GGOPT_ROW_INLINE Py_ssize_t ggopt_masked_len(const float *fx, const float *fm, Py_ssize_t n,
                                                  float s, float slope) {
        const ggopt_att_f8 ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                                   -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        const ggopt_att_f8 sv = {s, s, s, s, s, s, s, s};
        const ggopt_att_f8 lv = {slope, slope, slope, slope, slope, slope, slope, slope};
        while (n >= 8) {
            ggopt_att_f8 xv, mv;
            memcpy(&xv, fx + n - 8, sizeof xv);
            memcpy(&mv, fm + n - 8, sizeof mv);
            ggopt_att_i8 keep = (sv * xv + lv * mv) != ninf;
            keep |= __builtin_shuffle(keep, (ggopt_att_i8){4, 5, 6, 7, 0, 1, 2, 3});
            keep |= __builtin_shuffle(keep, (ggopt_att_i8){2, 3, 0, 1, 6, 7, 4, 5});
            keep |= __builtin_shuffle(keep, (ggopt_att_i8){1, 0, 3, 2, 5, 4, 7, 6});
            if (keep[0]) break;
            n -= 8;
        }
        while (n > 0 && s * fx[n - 1] + slope * fm[n - 1] == -INFINITY) n--;
        return n;
    }

    typedef double ggopt_att_d8 __attribute__((vector_size(64)));

    /* max over j < n of s*fx[j] + slope*fm[j] (fm may be NULL), eight lanes at a time; a NaN
       propagates, as in the scalar form m = m > v ? m : v. */
    GGOPT_ROW_INLINE float ggopt_row_max(const float *fx, const float *fm, Py_ssize_t n,
                                          float s, float slope) {
        const ggopt_att_f8 sv = {s, s, s, s, s, s, s, s};
        const ggopt_att_f8 lv = {slope, slope, slope, slope, slope, slope, slope, slope};
        ggopt_att_f8 m8 = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                           -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        Py_ssize_t j = 0;
        for (; j + 8 <= n; j += 8) {
            ggopt_att_f8 v, mv;
            memcpy(&v, fx + j, sizeof v);
            v = sv * v;
            if (fm) {
                memcpy(&mv, fm + j, sizeof mv);
                v = v + lv * mv;
            }
            ggopt_att_i8 keep = m8 > v;
            m8 = (ggopt_att_f8)(((ggopt_att_i8)m8 & keep) | ((ggopt_att_i8)v & ~keep));
        }
        float mx = -INFINITY;
        for (int k = 0; k < 8; k++) mx = mx > m8[k] ? mx : m8[k];
        for (; j < n; j++) {
            float v = s * fx[j] + (fm ? slope * fm[j] : 0.0f);
            mx = mx > v ? mx : v;
        }
        return mx;
    }

    /* sum over i < n of (double)fd[i]: eight double lanes, added pairwise at the end */
    GGOPT_ROW_INLINE double ggopt_row_sum(const float *fd, Py_ssize_t n) {
        ggopt_att_d8 a8 = {0, 0, 0, 0, 0, 0, 0, 0};
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) {
            ggopt_att_f8 e;
            memcpy(&e, fd + i, sizeof e);
            a8 += __builtin_convertvector(e, ggopt_att_d8);
        }
        double a = ((a8[0] + a8[1]) + (a8[2] + a8[3])) + ((a8[4] + a8[5]) + (a8[6] + a8[7]));
        for (; i < n; i++) a += (double)fd[i];
        return a;
    }
    #else
    GGOPT_ROW_INLINE float ggopt_row_max(const float *fx, const float *fm, Py_ssize_t n,
                                          float s, float slope) {
        float mx = -INFINITY;
        for (Py_ssize_t j = 0; j < n; j++) {
            float v = s * fx[j] + (fm ? slope * fm[j] : 0.0f);
            mx = mx > v ? mx : v;
        }
        return mx;
    }

    GGOPT_ROW_INLINE double ggopt_row_sum(const float *fd, Py_ssize_t n) {
        double a = 0;
        for (Py_ssize_t i = 0; i < n; i++) a += (double)fd[i];
        return a;
    }

    GGOPT_ROW_INLINE Py_ssize_t ggopt_masked_len(const float *fx, const float *fm, Py_ssize_t n,
                                                  float s, float slope) {
        while (n > 0 && s * fx[n - 1] + slope * fm[n - 1] == -INFINITY) n--;
        return n;
    }
    #endif
    #define GGOPT_AAT_W(p, s, i) (*(float *)((char *)(p) + (i) * (s)))

    /* softmax(s*x + slope*m) over one row into d; m may be NULL (no mask). */
    GGOPT_MULTIVERSION
    static void ggopt_masked_softmax_row(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                                         const char *m, Py_ssize_t ms, Py_ssize_t n, float s,
                                         float slope) {
        float mx = -INFINITY;
        double sum = 0;
        if (ds == 4 && xs == 4 && (m == NULL || ms == 4)) {
            float *fd = (float *)d;
            const float *fx = (const float *)x, *fm = (const float *)m;
            /* A masked-out tail (a causal mask's upper triangle) gives exact zeros: its exps
               are skipped. A row masked out entirely is computed in full (NaN, as in ggml). */
            Py_ssize_t n_all = n;
            if (fm) {
                n = ggopt_masked_len(fx, fm, n, s, slope);
                if (n == 0) n = n_all;
            }
            mx = ggopt_row_max(fx, fm, n, s, slope);
            /* The exps and the scaling run on to a multiple of 16 elements inside the row, so
               that short rows take no scalar tail: the extra elements are overwritten with
               zeros below (the sum still covers exactly n elements). */
            Py_ssize_t nv = (n + 15) / 16 * 16;
            nv = nv < n_all ? nv : n_all;
            if (fm)
                for (Py_ssize_t i = 0; i < nv; i++)
                    fd[i] = ggopt_expf(s * fx[i] + slope * fm[i] - mx);
            else
                for (Py_ssize_t i = 0; i < nv; i++) fd[i] = ggopt_expf(s * fx[i] - mx);
            float inv = (float)(1.0 / ggopt_row_sum(fd, n));
            Py_ssize_t i;
            for (i = 0; i < nv; i++) fd[i] *= inv;
            for (i = n; i < n_all; i++) fd[i] = 0.0f;
            return;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = s * GGOPT_AAT(x, xs, i) + (m ? slope * GGOPT_AAT(m, ms, i) : 0.0f);
            mx = mx > v ? mx : v;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = s * GGOPT_AAT(x, xs, i) + (m ? slope * GGOPT_AAT(m, ms, i) : 0.0f);
            float e = ggopt_expf(v - mx);
            GGOPT_AAT_W(d, ds, i) = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (Py_ssize_t i = 0; i < n; i++) GGOPT_AAT_W(d, ds, i) *= inv;
    }
    """
    void ggopt_masked_softmax_row(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                                  const char *m, Py_ssize_t ms, Py_ssize_t n, float s,
                                  float slope) noexcept nogil
    float powf(float, float) noexcept nogil
    float log2f(float) noexcept nogil
    float floorf(float) noexcept nogil

# Below this many element-operations a kernel stays on one thread; one exp counts as _EXP_COST.
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)
cdef Py_ssize_t _EXP_COST = 16


cdef struct Job:
    Arr4 x
    Arr4 m          # mask (has_mask)
    Arr4 d
    bint has_mask
    float scale
    float m0        # ALiBi bases (max_bias > 0)
    float m1
    int n_head_log2
    bint alibi
    int n_past
    float value


cdef inline char *_row(const Arr4 *a, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1) noexcept nogil:
    return a.data + i3 * a.s[0] + i2 * a.s[1] + i1 * a.s[2]


cdef inline float _slope(const Job *j, Py_ssize_t h) noexcept nogil:
    """ggml's ALiBi slope of head h: m0^(h+1) for the first n_head_log2 heads, then odd
    powers of m1."""
    if not j.alibi:
        return 1.0
    if h < j.n_head_log2:
        return powf(j.m0, <float>(h + 1))
    return powf(j.m1, <float>(2 * (h - j.n_head_log2) + 1))


cdef void _softmax_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                       Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Job *j = <Job *>ctx
    cdef const char *m = NULL
    if j.has_mask:
        m = _row(&j.m, i3 % j.m.n[0], i2 % j.m.n[1], i1)
    ggopt_masked_softmax_row(_row(&j.d, i3, i2, i1), j.d.s[3], _row(&j.x, i3, i2, i1), j.x.s[3],
                             m, j.m.s[3], j.x.n[3], j.scale, _slope(j, i2))


cdef void _shape_check(const Arr4 *a, const Arr4 *b, str what) except *:
    cdef int k
    for k in range(4):
        if a.n[k] != b.n[k]:
            raise ShapeError(f"{what} must have the shape of a "
                             f"{tuple([a.n[q] for q in range(4)])}, got "
                             f"{tuple([b.n[q] for q in range(4)])}")


cdef void _rows_shape(const Arr4 *a, Py_ssize_t *shape) noexcept nogil:
    shape[0] = a.n[0]
    shape[1] = a.n[1]
    shape[2] = a.n[2]
    shape[3] = 1  # one element per row: drive_elements hands out whole rows


def soft_max_ext(const float[:, :, :, :] a not None, object mask, float[:, :, :, :] dst not None,
                 float scale, float max_bias, int n_threads):
    """``dst = softmax(scale*a + slope*mask)`` along the last axis (ggml_soft_max_ext).

    ``mask`` is None or float32 ``(m3, m2, m1, ne0)`` with ``m1 >= ne1`` and ``m3``, ``m2``
    dividing ``ne3``, ``ne2``. ``slope`` is 1, or with ``max_bias > 0`` ALiBi's slope of head
    ``i2`` (``ne2`` heads).
    """
    check_n_threads("soft_max_ext", n_threads)
    cdef Job j
    cdef Py_ssize_t shape[4]
    cdef const float[:, :, :, :] mv
    cdef float n_head = a.shape[1]
    arr4_set(&j.x, a)
    arr4_set(&j.d, dst)
    _shape_check(&j.x, &j.d, "soft_max_ext (ggml_soft_max_ext): dst")
    j.has_mask = mask is not None
    j.m.s[3] = 0
    if j.has_mask:
        mv = mask
        arr4_set(&j.m, mv)
        if (j.m.n[3] != j.x.n[3] or j.m.n[2] < j.x.n[2] or j.m.n[1] == 0 or j.m.n[0] == 0
                or j.x.n[1] % j.m.n[1] or j.x.n[0] % j.m.n[0]):
            raise ShapeError(
                "soft_max_ext (ggml_soft_max_ext): the mask "
                f"{tuple([j.m.n[q] for q in range(4)])} does not broadcast over a "
                f"{tuple([j.x.n[q] for q in range(4)])} (same ne0, at least as many rows, "
                "dims 2 and 3 dividing a's)")
    elif max_bias > 0:
        raise ShapeError("soft_max_ext (ggml_soft_max_ext): ALiBi (max_bias > 0) needs a mask")
    j.scale = scale
    j.alibi = max_bias > 0
    if j.alibi:
        j.n_head_log2 = 1 << <int>floorf(log2f(n_head))
        j.m0 = powf(2.0, -max_bias / j.n_head_log2)
        j.m1 = powf(2.0, -(max_bias / 2.0) / j.n_head_log2)
    if j.x.n[3] == 0:
        return
    _rows_shape(&j.x, shape)
    cdef bint par = n_threads > 1 and arr4_size(&j.x) * _EXP_COST >= _PAR_MIN_WORK
    with nogil:
        drive_elements(shape, _softmax_row, &j, par, n_threads)


cdef void _diag_row(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                    Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Job *j = <Job *>ctx
    cdef const char *x = _row(&j.x, i3, i2, i1)
    cdef char *d = _row(&j.d, i3, i2, i1)
    cdef Py_ssize_t xs = j.x.s[3], ds = j.d.s[3], n = j.x.n[3], i
    cdef Py_ssize_t keep = min(n, max(<Py_ssize_t>0, j.n_past + i1 + 1))
    for i in range(keep):
        (<float *>(d + i * ds))[0] = (<const float *>(x + i * xs))[0]
    for i in range(keep, n):
        (<float *>(d + i * ds))[0] = j.value


def diag_mask(const float[:, :, :, :] a not None, float[:, :, :, :] dst not None, int n_past,
              float value, int n_threads):
    """``dst = a`` with ``value`` in every column ``i0 > n_past + i1`` of row ``i1``
    (ggml_diag_mask_inf with ``value = -inf``, ggml_diag_mask_zero with 0)."""
    check_n_threads("diag_mask", n_threads)
    cdef Job j
    cdef Py_ssize_t shape[4]
    arr4_set(&j.x, a)
    arr4_set(&j.d, dst)
    _shape_check(&j.x, &j.d, "diag_mask (ggml_diag_mask_inf): dst")
    if n_past < 0:
        raise ShapeError(f"diag_mask (ggml_diag_mask_inf): n_past must be >= 0, got {n_past}")
    j.n_past = n_past
    j.value = value
    if j.x.n[3] == 0:
        return
    _rows_shape(&j.x, shape)
    cdef bint par = n_threads > 1 and arr4_size(&j.x) >= _PAR_MIN_WORK
    with nogil:
        drive_elements(shape, _diag_row, &j, par, n_threads)
