/* The two forms of _thin.pyx's thin products, on 16-float vectors (GCC vector extensions,
   one AVX-512 register, two AVX2 ones). Every output's sum has a fixed order that depends on
   nothing but its own row of x and column of y, so no cut of the work changes a bit:

   rows: out[i, j] = ((x[i,0] y[0,j] + x[i,1] y[1,j]) + x[i,2] y[2,j]) + ..., k ascending
         (the running sum starts at 0). Needs y's rows with a unit stride.
   dots: out[i, c] = x[i] . yt[c] with 16 running sums (element k to sum k % 16, ascending k)
         added pairwise (lanes l and l + 8, then l + 4, l + 2, l + 1), GemmPlan's one-token
         order (ggopt_dot_rows). Needs x and yt rows with a unit stride.

   With add, the sum s is added to the destination once (d + s), as an add after the
   product; otherwise it is stored. The destination may have any strides. Needs
   GGOPT_MULTIVERSION and GGOPT_ROW_INLINE (_common.pxd). No FMA: setup.py. */
#ifndef GGOPT_THIN_KERNELS_H
#define GGOPT_THIN_KERNELS_H
#include <string.h>

typedef float thin_v16 __attribute__((vector_size(64)));
typedef float thin_v8 __attribute__((vector_size(32)));
typedef float thin_v4 __attribute__((vector_size(16)));

GGOPT_ROW_INLINE thin_v16 thin_load(const float *p) {
    thin_v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the first n (< 16) floats at p, the others zero */
GGOPT_ROW_INLINE thin_v16 thin_load_n(const float *p, int n) {
    float t[16] = {0};
    memcpy(t, p, n * sizeof(float));
    return thin_load(t);
}

/* the 16 lanes added pairwise: l + 8, then l + 4, l + 2, l + 1 (as ggopt_dot_rows) */
GGOPT_ROW_INLINE float thin_lanes_sum(thin_v16 v) {
    thin_v8 lo8, hi8;
    memcpy(&lo8, &v, sizeof lo8);
    memcpy(&hi8, (const char *)&v + sizeof lo8, sizeof hi8);
    lo8 += hi8;
    thin_v4 lo4, hi4;
    memcpy(&lo4, &lo8, sizeof lo4);
    memcpy(&hi4, (const char *)&lo8 + sizeof lo4, sizeof hi4);
    lo4 += hi4;
    float a = lo4[0] + lo4[2], b = lo4[1] + lo4[3];
    return a + b;
}

/* dst[j * ds] = v[j], or dst[j * ds] += v[j] with add, for j < n <= 16 */
GGOPT_ROW_INLINE void thin_put(float *dst, Py_ssize_t ds, thin_v16 v, int n, int add) {
    if (ds == 1 && n == 16) {
        if (add) v += thin_load(dst);
        memcpy(dst, &v, sizeof v);
        return;
    }
    float t[16];
    memcpy(t, &v, sizeof t);
    for (int j = 0; j < n; j++) dst[j * ds] = add ? dst[j * ds] + t[j] : t[j];
}

/* s[r] += x[r*xs0 + kk*xs1] * y[kk*ys0 + lane] for kk < kc, r < rb, in order of kk;
   n: the valid lanes, loaded alone when partial; ahead: also prefetch the same columns of
   the next chunk's kc rows (the big operand comes from memory: LoRA's backward pass) */
GGOPT_ROW_INLINE void thin_rows_chunk(thin_v16 *s, const float *x, Py_ssize_t xs0,
                                      Py_ssize_t xs1, const float *y, Py_ssize_t ys0, int kc,
                                      int n, int partial, int ahead, const int rb) {
    if (ahead)
        for (int kk = 0; kk < kc; kk++) __builtin_prefetch(y + (kc + kk) * ys0);
    for (int kk = 0; kk < kc; kk++) {
        thin_v16 yv = partial ? thin_load_n(y + kk * ys0, n) : thin_load(y + kk * ys0);
        for (int r = 0; r < rb; r++) s[r] += yv * x[r * xs0 + kk * xs1];
    }
}

/* The rows form on rb (<= 8) rows and nc columns. The reduction goes in chunks of 8 rows of
   y, each chunk swept across all columns (8 contiguous streams of y); the running sums of a
   chunk are kept in part (rb rows of ldp floats) for the next. padded: y's rows hold whole
   vectors (zeros past nc). */
GGOPT_ROW_INLINE void thin_rows_group(const float *x, Py_ssize_t xs0, Py_ssize_t xs1,
                                      const float *y, Py_ssize_t ys0, Py_ssize_t k,
                                      Py_ssize_t nc, float *dst, Py_ssize_t ds0,
                                      Py_ssize_t ds1, int add, float *part, Py_ssize_t ldp,
                                      int padded, const int rb) {
    for (Py_ssize_t k0 = 0; k0 < k; k0 += 8) {
        int kc = k - k0 < 8 ? (int)(k - k0) : 8, last = k0 + 8 >= k;
        const float *xk = x + k0 * xs1, *yk = y + k0 * ys0;
        for (Py_ssize_t j = 0; j < nc; j += 16) {
            int n = nc - j < 16 ? (int)(nc - j) : 16, partial = n < 16 && !padded;
            thin_v16 s[8];
            for (int r = 0; r < rb; r++)
                s[r] = k0 ? thin_load(part + r * ldp + j) : (thin_v16){0};
            if (kc == 8 && !partial)
                thin_rows_chunk(s, xk, xs0, xs1, yk + j, ys0, 8, 16, 0, k0 + 16 <= k, rb);
            else
                thin_rows_chunk(s, xk, xs0, xs1, yk + j, ys0, kc, n, partial, 0, rb);
            for (int r = 0; r < rb; r++) {
                if (last)
                    thin_put(dst + r * ds0 + j * ds1, ds1, s[r], n, add);
                else
                    memcpy(part + r * ldp + j, &s[r], sizeof s[r]);
            }
        }
    }
}

/* The rows form on rows 0 .. nr-1 and nc columns; part: 8 rows of ldp >= nc rounded up to
   16 floats */
GGOPT_MULTIVERSION
static void thin_rows(const float *x, Py_ssize_t xs0, Py_ssize_t xs1, const float *y,
                      Py_ssize_t ys0, Py_ssize_t k, Py_ssize_t nr, Py_ssize_t nc, float *dst,
                      Py_ssize_t ds0, Py_ssize_t ds1, int add, float *part, Py_ssize_t ldp,
                      int padded) {
    Py_ssize_t r = 0;
    for (; r + 8 <= nr; r += 8)
        thin_rows_group(x + r * xs0, xs0, xs1, y, ys0, k, nc, dst + r * ds0, ds0, ds1, add,
                        part, ldp, padded, 8);
    if (r + 4 <= nr) {
        thin_rows_group(x + r * xs0, xs0, xs1, y, ys0, k, nc, dst + r * ds0, ds0, ds1, add,
                        part, ldp, padded, 4);
        r += 4;
    }
    if (r + 2 <= nr) {
        thin_rows_group(x + r * xs0, xs0, xs1, y, ys0, k, nc, dst + r * ds0, ds0, ds1, add,
                        part, ldp, padded, 2);
        r += 2;
    }
    if (r < nr)
        thin_rows_group(x + r * xs0, xs0, xs1, y, ys0, k, nc, dst + r * ds0, ds0, ds1, add,
                        part, ldp, padded, 1);
}

/* The dots form on rb (<= 4) rows of x and cb (<= 4) rows of yt; x is prefetched this many
   floats ahead (1 KB) */
#define THIN_DOTS_AHEAD 256
GGOPT_ROW_INLINE void thin_dots_tile(const float *x, Py_ssize_t xs0, const float *yt,
                                     Py_ssize_t ys0, Py_ssize_t k, float *dst, Py_ssize_t ds0,
                                     Py_ssize_t ds1, int add, const int rb, const int cb) {
    thin_v16 s[4][4];
    Py_ssize_t whole = k - k % 16;
    int rest = (int)(k % 16);
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) s[r][c] = (thin_v16){0};
    for (Py_ssize_t i = 0; i < whole; i += 16) {
        thin_v16 xv[4];
        for (int r = 0; r < rb; r++) {
            __builtin_prefetch(x + r * xs0 + i + THIN_DOTS_AHEAD);
            xv[r] = thin_load(x + r * xs0 + i);
        }
        for (int c = 0; c < cb; c++) {
            thin_v16 yv = thin_load(yt + c * ys0 + i);
            for (int r = 0; r < rb; r++) s[r][c] += yv * xv[r];
        }
    }
    if (rest) {
        thin_v16 xv[4];
        for (int r = 0; r < rb; r++) xv[r] = thin_load_n(x + r * xs0 + whole, rest);
        for (int c = 0; c < cb; c++) {
            thin_v16 yv = thin_load_n(yt + c * ys0 + whole, rest);
            for (int r = 0; r < rb; r++) s[r][c] += yv * xv[r];
        }
    }
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) {
            float v = thin_lanes_sum(s[r][c]);
            float *d = dst + r * ds0 + c * ds1;
            *d = add ? *d + v : v;
        }
}

GGOPT_ROW_INLINE void thin_dots_strip(const float *x, Py_ssize_t xs0, const float *yt,
                                      Py_ssize_t ys0, Py_ssize_t k, Py_ssize_t nc, float *dst,
                                      Py_ssize_t ds0, Py_ssize_t ds1, int add, const int rb) {
    Py_ssize_t c = 0;
    for (; c + 4 <= nc; c += 4)
        thin_dots_tile(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add, rb, 4);
    if (c + 2 <= nc) {
        thin_dots_tile(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add, rb, 2);
        c += 2;
    }
    if (c < nc)
        thin_dots_tile(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add, rb, 1);
}

/* The dots form on rows 0 .. nr-1 of x and all nc rows of yt */
GGOPT_MULTIVERSION
static void thin_dots(const float *x, Py_ssize_t xs0, const float *yt, Py_ssize_t ys0,
                      Py_ssize_t k, Py_ssize_t nr, Py_ssize_t nc, float *dst, Py_ssize_t ds0,
                      Py_ssize_t ds1, int add) {
    Py_ssize_t r = 0;
    for (; r + 4 <= nr; r += 4)
        thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 4);
    if (r + 2 <= nr) {
        thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 2);
        r += 2;
    }
    if (r < nr)
        thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 1);
}

/* dst[i*ld + j] = src[i*s0 + j*s1] for i < n0, j < n1; zeros for n1 <= j < ld */
static void thin_pack(float *dst, Py_ssize_t ld, const float *src, Py_ssize_t s0,
                      Py_ssize_t s1, Py_ssize_t n0, Py_ssize_t n1) {
    for (Py_ssize_t i = 0; i < n0; i++) {
        float *d = dst + i * ld;
        const float *s = src + i * s0;
        for (Py_ssize_t j = 0; j < n1; j++) d[j] = s[j * s1];
        for (Py_ssize_t j = n1; j < ld; j++) d[j] = 0.0f;
    }
}

#endif
