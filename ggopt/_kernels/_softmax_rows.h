/* Row helpers of the softmax and cross-entropy kernels (_softmax.pyx, _ce_ids.pyx) over
   contiguous float32 rows: max, double-precision sums, the exps. GGOPT_ROW_INLINE and
   ggopt_expf come from _common.pxd, whose C precedes this header in every module. */
#ifndef GGOPT_SOFTMAX_ROWS_H
#define GGOPT_SOFTMAX_ROWS_H
#include <math.h>

/* max_i s*x[i] over a contiguous row (-inf when n == 0). */
GGOPT_ROW_INLINE float ggopt_row_max(const float *x, Py_ssize_t n, float s) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            float v = s * x[i + k];
            m[k] = m[k] > v ? m[k] : v;
        }
    for (; i < n; i++) {
        float v = s * x[i];
        m[0] = m[0] > v ? m[0] : v;
    }
    for (int k = 1; k < 8; k++) m[0] = m[0] > m[k] ? m[0] : m[k];
    return m[0];
}

/* Sum of a contiguous row in double, with independent partial sums. */
GGOPT_ROW_INLINE double ggopt_row_sum_d(const float *x, Py_ssize_t n) {
    double a[4] = {0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) a[k] += (double)x[i + k];
    for (; i < n; i++) a[0] += (double)x[i];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

/* d[i] = exp(s*x[i] - m) over a contiguous row (d may be x); returns sum(d) in double. */
GGOPT_ROW_INLINE double ggopt_row_exp(float *d, const float *x, Py_ssize_t n, float s,
                                      float m) {
    for (Py_ssize_t i = 0; i < n; i++) d[i] = ggopt_expf(s * x[i] - m);
    return ggopt_row_sum_d(d, n);
}

/* sum_i exp(s*x[i] - m) in double over a contiguous row, without storing the exps. */
GGOPT_ROW_INLINE double ggopt_row_expsum(const float *x, Py_ssize_t n, float s, float m) {
    float buf[256];
    double acc = 0;
    for (Py_ssize_t start = 0; start < n; start += 256) {
        Py_ssize_t k = n - start < 256 ? n - start : 256;
        for (Py_ssize_t i = 0; i < k; i++) buf[i] = ggopt_expf(s * x[start + i] - m);
        acc += ggopt_row_sum_d(buf, k);
    }
    return acc;
}

#endif
