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
   GGOPT_MULTIVERSION and GGOPT_ROW_INLINE (_common.pxd). No FMA: setup.py.

   The register tiles are sized for the CPU: AVX-512 holds a 16-float vector in one of 32
   registers, AVX2 in two of 16, so without AVX-512 the tiles are narrower (rows: vectors of 8
   columns, not 16; dots: 2 x 2, not 4 x 4, each sum as two 8-lane halves). The tiles only
   group outputs: no order changes, the same bits (a NaN's sign and payload aside: x86 keeps
   the first operand's NaN, and the compiler orders an add's operands as it likes). */
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

GGOPT_ROW_INLINE thin_v8 thin_load8(const float *p) {
    thin_v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* 16 lanes held as two halves (lanes 0-7, 8-15) added pairwise: l + 8, then l + 4, l + 2,
   l + 1 (as ggopt_dot_rows) */
GGOPT_ROW_INLINE float thin_halves_sum(thin_v8 lo8, thin_v8 hi8) {
    lo8 += hi8;
    thin_v4 lo4, hi4;
    memcpy(&lo4, &lo8, sizeof lo4);
    memcpy(&hi4, (const char *)&lo8 + sizeof lo4, sizeof hi4);
    lo4 += hi4;
    float a = lo4[0] + lo4[2], b = lo4[1] + lo4[3];
    return a + b;
}

/* the 16 lanes added pairwise (thin_halves_sum) */
GGOPT_ROW_INLINE float thin_lanes_sum(thin_v16 v) {
    thin_v8 lo8, hi8;
    memcpy(&lo8, &v, sizeof lo8);
    memcpy(&hi8, (const char *)&v + sizeof lo8, sizeof hi8);
    return thin_halves_sum(lo8, hi8);
}

/* the first n (< 8) floats at p, the others zero */
GGOPT_ROW_INLINE thin_v8 thin_load_n8(const float *p, int n) {
    float t[8] = {0};
    memcpy(t, p, n * sizeof(float));
    return thin_load8(t);
}

/* dst[j * ds] = v[j], or dst[j * ds] += v[j] with add, for j < n <= 8 */
GGOPT_ROW_INLINE void thin_put8(float *dst, Py_ssize_t ds, thin_v8 v, int n, int add) {
    if (ds == 1 && n == 8) {
        if (add) v += thin_load8(dst);
        memcpy(dst, &v, sizeof v);
        return;
    }
    float t[8];
    memcpy(t, &v, sizeof t);
    for (int j = 0; j < n; j++) dst[j * ds] = add ? dst[j * ds] + t[j] : t[j];
}

/* thin_put8 for j < n <= 16, as the vector's two halves */
GGOPT_ROW_INLINE void thin_put(float *dst, Py_ssize_t ds, thin_v16 v, int n, int add) {
    thin_v8 lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    thin_put8(dst, ds, lo, n < 8 ? n : 8, add);
    if (n > 8) thin_put8(dst + 8 * ds, ds, hi, n - 8, add);
}

/* The rows form's group on W-lane vectors V (16 with AVX-512, 8 on AVX2: ggopt_cpu_narrow), as
   NAME (LOAD, LOAD_N, PUT: V's thin_load, thin_load_n, thin_put). Only the columns a vector
   holds differ; every output's sum is the same.

   NAME_chunk: s[r] += x[r*xs0 + kk*xs1] * y[kk*ys0 + lane] for kk < kc, r < rb, in order of
   kk; n: the valid lanes, loaded alone when partial; ahead: also prefetch the same columns of
   the next chunk's kc rows (the big operand comes from memory: LoRA's backward pass).

   NAME: the rows form on rb (<= 8) rows and nc columns. The reduction goes in chunks of 8
   rows of y, each chunk swept across all columns (8 contiguous streams of y); the running
   sums of a chunk are kept in part (rb rows of ldp floats) for the next. padded: y's rows
   hold whole 16-float vectors (zeros past nc). */
#define THIN_ROWS_GROUP(NAME, V, W, LOAD, LOAD_N, PUT)                                       \
GGOPT_ROW_INLINE void NAME##_chunk(V *s, const float *x, Py_ssize_t xs0, Py_ssize_t xs1,     \
                                   const float *y, Py_ssize_t ys0, int kc, int n,            \
                                   int partial, int ahead, const int rb) {                   \
    if (ahead)                                                                               \
        for (int kk = 0; kk < kc; kk++) __builtin_prefetch(y + (kc + kk) * ys0);             \
    for (int kk = 0; kk < kc; kk++) {                                                        \
        V yv = partial ? LOAD_N(y + kk * ys0, n) : LOAD(y + kk * ys0);                       \
        for (int r = 0; r < rb; r++) s[r] += yv * x[r * xs0 + kk * xs1];                     \
    }                                                                                        \
}                                                                                            \
                                                                                             \
GGOPT_ROW_INLINE void NAME(const float *x, Py_ssize_t xs0, Py_ssize_t xs1, const float *y,   \
                           Py_ssize_t ys0, Py_ssize_t k, Py_ssize_t nc, float *dst,          \
                           Py_ssize_t ds0, Py_ssize_t ds1, int add, float *part,             \
                           Py_ssize_t ldp, int padded, const int rb) {                       \
    for (Py_ssize_t k0 = 0; k0 < k; k0 += 8) {                                               \
        int kc = k - k0 < 8 ? (int)(k - k0) : 8, last = k0 + 8 >= k;                         \
        const float *xk = x + k0 * xs1, *yk = y + k0 * ys0;                                  \
        for (Py_ssize_t j = 0; j < nc; j += W) {                                             \
            int n = nc - j < W ? (int)(nc - j) : W, partial = n < W && !padded;              \
            V s[8];                                                                          \
            for (int r = 0; r < rb; r++)                                                     \
                s[r] = k0 ? LOAD(part + r * ldp + j) : (V){0};                               \
            if (kc == 8 && !partial)                                                         \
                NAME##_chunk(s, xk, xs0, xs1, yk + j, ys0, 8, W, 0, k0 + 16 <= k, rb);       \
            else                                                                             \
                NAME##_chunk(s, xk, xs0, xs1, yk + j, ys0, kc, n, partial, 0, rb);           \
            for (int r = 0; r < rb; r++) {                                                   \
                if (last)                                                                    \
                    PUT(dst + r * ds0 + j * ds1, ds1, s[r], n, add);                         \
                else                                                                         \
                    memcpy(part + r * ldp + j, &s[r], sizeof s[r]);                          \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
}

THIN_ROWS_GROUP(thin_rows_group, thin_v16, 16, thin_load, thin_load_n, thin_put)
THIN_ROWS_GROUP(thin_rows_group8, thin_v8, 8, thin_load8, thin_load_n8, thin_put8)

/* The rows form on rows 0 .. nr-1 and nc columns; part: 8 rows of ldp >= nc rounded up to
   16 floats; narrow: 8-float vectors (ggopt_cpu_narrow) */
GGOPT_MULTIVERSION
static void thin_rows(const float *x, Py_ssize_t xs0, Py_ssize_t xs1, const float *y,
                      Py_ssize_t ys0, Py_ssize_t k, Py_ssize_t nr, Py_ssize_t nc, float *dst,
                      Py_ssize_t ds0, Py_ssize_t ds1, int add, float *part, Py_ssize_t ldp,
                      int padded, int narrow) {
#define THIN_ROWS_GROUPS(GROUP)                                                              \
    do {                                                                                     \
        Py_ssize_t r = 0;                                                                    \
        for (; r + 8 <= nr; r += 8)                                                          \
            GROUP(x + r * xs0, xs0, xs1, y, ys0, k, nc, dst + r * ds0, ds0, ds1, add, part,  \
                  ldp, padded, 8);                                                           \
        THIN_ROWS_REST(GROUP, 4);                                                            \
        THIN_ROWS_REST(GROUP, 2);                                                            \
        THIN_ROWS_REST(GROUP, 1);                                                            \
    } while (0)
#define THIN_ROWS_REST(GROUP, RB)                                                            \
    if (r + RB <= nr) {                                                                      \
        GROUP(x + r * xs0, xs0, xs1, y, ys0, k, nc, dst + r * ds0, ds0, ds1, add, part, ldp, \
              padded, RB);                                                                   \
        r += RB;                                                                             \
    }
    if (narrow)
        THIN_ROWS_GROUPS(thin_rows_group8);
    else
        THIN_ROWS_GROUPS(thin_rows_group);
#undef THIN_ROWS_GROUPS
#undef THIN_ROWS_REST
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

/* lo/hi[r][c] += xr[r][0..15] * yc[c][0..15] lane by lane, as two 8-lane halves */
GGOPT_ROW_INLINE void thin_dots_step_narrow(thin_v8 lo[2][2], thin_v8 hi[2][2],
                                            const float *xr[2], const float *yc[2],
                                            const int rb, const int cb) {
    thin_v8 xl[2], xh[2];
    for (int r = 0; r < rb; r++) {
        xl[r] = thin_load8(xr[r]);
        xh[r] = thin_load8(xr[r] + 8);
    }
    for (int c = 0; c < cb; c++) {
        thin_v8 yl = thin_load8(yc[c]), yh = thin_load8(yc[c] + 8);
        for (int r = 0; r < rb; r++) {
            lo[r][c] += yl * xl[r];
            hi[r][c] += yh * xh[r];
        }
    }
}

/* thin_dots_tile on rb, cb <= 2 with each 16-lane sum held as two 8-lane halves (AVX2's
   registers; GCC splits a 16-float vector badly there): the same lanes, the same sums */
GGOPT_ROW_INLINE void thin_dots_tile_narrow(const float *x, Py_ssize_t xs0, const float *yt,
                                            Py_ssize_t ys0, Py_ssize_t k, float *dst,
                                            Py_ssize_t ds0, Py_ssize_t ds1, int add,
                                            const int rb, const int cb) {
    thin_v8 lo[2][2], hi[2][2];
    const float *xr[2], *yc[2];
    Py_ssize_t whole = k - k % 16;
    int rest = (int)(k % 16);
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) lo[r][c] = hi[r][c] = (thin_v8){0};
    for (Py_ssize_t i = 0; i < whole; i += 16) {
        for (int r = 0; r < rb; r++) {
            xr[r] = x + r * xs0 + i;
            __builtin_prefetch(xr[r] + THIN_DOTS_AHEAD);
        }
        for (int c = 0; c < cb; c++) yc[c] = yt + c * ys0 + i;
        thin_dots_step_narrow(lo, hi, xr, yc, rb, cb);
    }
    if (rest) {  /* the last elements, zeros past k */
        float xt[2][16] = {{0}}, ytail[2][16] = {{0}};
        for (int r = 0; r < rb; r++) {
            memcpy(xt[r], x + r * xs0 + whole, rest * sizeof(float));
            xr[r] = xt[r];
        }
        for (int c = 0; c < cb; c++) {
            memcpy(ytail[c], yt + c * ys0 + whole, rest * sizeof(float));
            yc[c] = ytail[c];
        }
        thin_dots_step_narrow(lo, hi, xr, yc, rb, cb);
    }
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) {
            float v = thin_halves_sum(lo[r][c], hi[r][c]);
            float *d = dst + r * ds0 + c * ds1;
            *d = add ? *d + v : v;
        }
}

GGOPT_ROW_INLINE void thin_dots_strip(const float *x, Py_ssize_t xs0, const float *yt,
                                      Py_ssize_t ys0, Py_ssize_t k, Py_ssize_t nc, float *dst,
                                      Py_ssize_t ds0, Py_ssize_t ds1, int add, const int rb,
                                      const int cb) {
    Py_ssize_t c = 0;
    if (cb == 2) {  /* narrow */
        for (; c + 2 <= nc; c += 2)
            thin_dots_tile_narrow(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add,
                                  rb, 2);
        if (c < nc)
            thin_dots_tile_narrow(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add,
                                  rb, 1);
        return;
    }
    for (; c + 4 <= nc; c += 4)
        thin_dots_tile(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add, rb, 4);
    if (c + 2 <= nc) {
        thin_dots_tile(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add, rb, 2);
        c += 2;
    }
    if (c < nc)
        thin_dots_tile(x, xs0, yt + c * ys0, ys0, k, dst + c * ds1, ds0, ds1, add, rb, 1);
}

/* The dots form on rows 0 .. nr-1 of x and all nc rows of yt; narrow: tiles of at most
   2 x 2 (ggopt_cpu_narrow) */
GGOPT_MULTIVERSION
static void thin_dots(const float *x, Py_ssize_t xs0, const float *yt, Py_ssize_t ys0,
                      Py_ssize_t k, Py_ssize_t nr, Py_ssize_t nc, float *dst, Py_ssize_t ds0,
                      Py_ssize_t ds1, int add, int narrow) {
    Py_ssize_t r = 0;
    if (narrow) {
        for (; r + 2 <= nr; r += 2)
            thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 2,
                            2);
        if (r < nr)
            thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 1,
                            2);
        return;
    }
    for (; r + 4 <= nr; r += 4)
        thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 4, 4);
    if (r + 2 <= nr) {
        thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 2, 4);
        r += 2;
    }
    if (r < nr)
        thin_dots_strip(x + r * xs0, xs0, yt, ys0, k, nc, dst + r * ds0, ds0, ds1, add, 1, 4);
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
