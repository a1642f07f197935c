/* GemmPlan's one-token products (_gemm.pyx). Needs GGOPT_MULTIVERSION and GGOPT_ROW_INLINE
   (_common.pxd). No FMA: setup.py. */
#ifndef GGOPT_DOT_ROWS_H
#define GGOPT_DOT_ROWS_H
#include <string.h>

/* One-token products (matrix-vector): out[j] = sum_k a[j*lda + k] * x[k] over rows j of a
   weight whose rows are contiguous. Each dot product keeps 16 running sums (element k goes
   to sum k % 16, ascending k) and adds them pairwise at the end in a fixed order, so an
   output's bits depend only on its row and x: not on the rows around it, the block it is
   computed in, the thread, or the instruction set (no FMA: -ffp-contract=off). Four rows
   are done at a time to load x once for all four, each prefetched 1 KB ahead. */
typedef float ggopt_v16 __attribute__((vector_size(64)));
GGOPT_ROW_INLINE ggopt_v16 ggopt_load16(const float *p) {
    ggopt_v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* s[0..15] added pairwise: lanes l + 8, then l + 4, l + 2, l + 1 */
GGOPT_ROW_INLINE float ggopt_pairwise16(float *s) {
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) s[l] += s[l + w];
    return s[0];
}
GGOPT_ROW_INLINE float ggopt_lanes_sum(ggopt_v16 v) {
    float s[16];
    memcpy(s, &v, sizeof s);
    return ggopt_pairwise16(s);
}
/* the last k % 16 elements of a row, zero-padded to 16 */
GGOPT_ROW_INLINE ggopt_v16 ggopt_tail16(const float *p, int n) {
    float t[16] = {0};
    memcpy(t, p, n * sizeof(float));
    return ggopt_load16(t);
}

/* ggopt_dot_rows on R rows with each 16-lane sum held as two 8-lane halves (lanes 0-7,
   8-15): AVX2's registers (GCC splits a 16-float vector badly there). The same lanes,
   the same sums. */
typedef float ggopt_v8 __attribute__((vector_size(32)));
GGOPT_ROW_INLINE ggopt_v8 ggopt_load8(const float *p) {
    ggopt_v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* ggopt_pairwise16 of four rows' sums (lanes 0-7 in lo[r], 8-15 in hi[r]) at once: the same
   additions with the same operands (lane l first, then lane l + w), across the rows in
   vectors instead of one row's lanes in scalars. */
typedef int ggopt_lanes8 __attribute__((vector_size(32)));
GGOPT_ROW_INLINE void ggopt_sums4_pairwise(const ggopt_v8 *lo, const ggopt_v8 *hi, float *out) {
    const ggopt_lanes8 first4 = {0, 1, 2, 3, 8, 9, 10, 11}, last4 = {4, 5, 6, 7, 12, 13, 14, 15};
    ggopt_v8 v0 = lo[0] + hi[0], v1 = lo[1] + hi[1], v2 = lo[2] + hi[2], v3 = lo[3] + hi[3];
    /* [w0 | w1], [w2 | w3]: w_r[l] = v_r[l] + v_r[l + 4] */
    ggopt_v8 w01 = __builtin_shuffle(v0, v1, first4) + __builtin_shuffle(v0, v1, last4);
    ggopt_v8 w23 = __builtin_shuffle(v2, v3, first4) + __builtin_shuffle(v2, v3, last4);
    /* [u0 u2 | u1 u3], two lanes each: u_r[l] = w_r[l] + w_r[l + 2] */
    ggopt_v8 u = __builtin_shuffle(w01, w23, (ggopt_lanes8){0, 1, 8, 9, 4, 5, 12, 13}) +
                 __builtin_shuffle(w01, w23, (ggopt_lanes8){2, 3, 10, 11, 6, 7, 14, 15});
    /* out[r] = u_r[0] + u_r[1] */
    ggopt_v8 o = __builtin_shuffle(u, (ggopt_lanes8){0, 4, 2, 6, 0, 4, 2, 6}) +
                 __builtin_shuffle(u, (ggopt_lanes8){1, 5, 3, 7, 1, 5, 3, 7});
    memcpy(out, &o, 4 * sizeof(float));
}

GGOPT_ROW_INLINE void ggopt_dot_rows_halves(const float *a, Py_ssize_t lda,
                                            const float *x, int k, float *out,
                                            const int R) {
    int whole = k - k % 16, rest = k % 16;
    ggopt_v8 lo[4], hi[4];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = (ggopt_v8){0};
    for (int i = 0; i < whole; i += 16) {
        ggopt_v8 xl = ggopt_load8(x + i), xh = ggopt_load8(x + i + 8);
        for (int r = 0; r < R; r++) {
            const float *ar = a + r * lda + i;
            __builtin_prefetch(ar + 256);
            lo[r] += ggopt_load8(ar) * xl;
            hi[r] += ggopt_load8(ar + 8) * xh;
        }
    }
    if (rest) {
        float xt[16] = {0};
        memcpy(xt, x + whole, rest * sizeof(float));
        for (int r = 0; r < R; r++) {
            float at[16] = {0};
            memcpy(at, a + r * lda + whole, rest * sizeof(float));
            lo[r] += ggopt_load8(at) * ggopt_load8(xt);
            hi[r] += ggopt_load8(at + 8) * ggopt_load8(xt + 8);
        }
    }
    if (R == 4) {
        ggopt_sums4_pairwise(lo, hi, out);
        return;
    }
    for (int r = 0; r < R; r++) {
        float s[16];
        memcpy(s, &lo[r], sizeof lo[r]);
        memcpy(s + 8, &hi[r], sizeof hi[r]);
        out[r] = ggopt_pairwise16(s);
    }
}

/* narrow: the halves (a CPU without AVX-512, ggopt_cpu_narrow) */
GGOPT_MULTIVERSION
static void ggopt_dot_rows(const float *a, Py_ssize_t lda, const float *x, int k,
                           float *out, int rows, int narrow) {
    if (narrow) {
        int j = 0;
        for (; j + 4 <= rows; j += 4)
            ggopt_dot_rows_halves(a + j * lda, lda, x, k, out + j, 4);
        for (; j < rows; j++) ggopt_dot_rows_halves(a + j * lda, lda, x, k, out + j, 1);
        return;
    }
    int whole = k - k % 16, rest = k % 16, j = 0;
    ggopt_v16 xt = ggopt_tail16(x + whole, rest);
    for (; j + 4 <= rows; j += 4) {
        const float *a0 = a + j * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        ggopt_v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int i = 0; i < whole; i += 16) {
            ggopt_v16 xv = ggopt_load16(x + i);
            __builtin_prefetch(a0 + i + 256);
            __builtin_prefetch(a1 + i + 256);
            __builtin_prefetch(a2 + i + 256);
            __builtin_prefetch(a3 + i + 256);
            s0 += ggopt_load16(a0 + i) * xv;
            s1 += ggopt_load16(a1 + i) * xv;
            s2 += ggopt_load16(a2 + i) * xv;
            s3 += ggopt_load16(a3 + i) * xv;
        }
        if (rest) {
            s0 += ggopt_tail16(a0 + whole, rest) * xt;
            s1 += ggopt_tail16(a1 + whole, rest) * xt;
            s2 += ggopt_tail16(a2 + whole, rest) * xt;
            s3 += ggopt_tail16(a3 + whole, rest) * xt;
        }
        ggopt_v16 s[4] = {s0, s1, s2, s3};
        ggopt_v8 lo[4], hi[4];
        for (int r = 0; r < 4; r++) {
            memcpy(&lo[r], &s[r], sizeof lo[r]);
            memcpy(&hi[r], (const float *)&s[r] + 8, sizeof hi[r]);
        }
        ggopt_sums4_pairwise(lo, hi, out + j);
    }
    for (; j < rows; j++) {
        const float *a0 = a + j * lda;
        ggopt_v16 s0 = {0};
        for (int i = 0; i < whole; i += 16)
            s0 += ggopt_load16(a0 + i) * ggopt_load16(x + i);
        if (rest)
            s0 += ggopt_tail16(a0 + whole, rest) * xt;
        out[j] = ggopt_lanes_sum(s0);
    }
}

#endif
