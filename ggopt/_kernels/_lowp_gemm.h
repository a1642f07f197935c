/* Low-precision products as ggml's CPU backend defines them: C(i, j) = sum_k r(X(i, k)) W(j, k)
   with W BF16 or F16, X float32 rounded to W's type (ggml's vec_dot_type, round to nearest
   even) and F32 sums. Included by _lowp.pyx.

   A packed, register-blocked GEMM: X is rounded and packed once into blocks of GGOPT_LP_MR rows,
   W into panels of GGOPT_LP_NR outputs (a thread's own scratch, the whole reduction, which
   stays in the second-level cache), and a micro-kernel keeps an MR x NR tile of sums in
   registers over the whole reduction. Threads share out the panels; every output is computed
   by one thread in one fixed order, so its bits depend neither on the thread count nor on
   the blocking.

   BF16: the order is vdpbf16ps's. X and W are packed in pairs (k = 2p, 2p + 1, one 32-bit
   word, 2p in the low half); each step adds the product of the odd elements, then that of the
   even ones, each a fused multiply-add rounded to nearest even with BF16 subnormal inputs read
   as zero and subnormal results flushed to zero, the MXCSR ignored (Intel's pseudocode, and
   what this Zen 4 computes, NaN payloads included). The hardware kernel (AVX-512 BF16) and
   the portable one (ggopt_lp_dp_step, any CPU) give the same bits; a NaN result is the first
   NaN of x, w, c (made quiet), or the default NaN 0xFFC00000.
   F16: X rounded to F16; one product per step, a fused multiply-add (the product of two F16
   values is exact in F32, so it equals a multiply then an add); AVX-512F or portable. */
#ifndef GGOPT_LOWP_GEMM_H
#define GGOPT_LOWP_GEMM_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#include <immintrin.h>
#define GGOPT_LP_X86 1
#else
#define GGOPT_LP_X86 0
#endif

#define GGOPT_LP_MR 8          /* rows of X per micro-tile */
#define GGOPT_LP_NV 3          /* 16-lane vectors of outputs per micro-tile */
#define GGOPT_LP_NR (16 * GGOPT_LP_NV)
#define GGOPT_LP_BF16 30
#define GGOPT_LP_F16 1
#define GGOPT_LP_PORTABLE 0    /* the kernels */
#define GGOPT_LP_DPBF16 1
#define GGOPT_LP_FMA 2

/* ---- conversions ---- */

static inline uint32_t ggopt_lp_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ggopt_lp_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ggml_compute_fp32_to_bf16: NaN made quiet, else round to nearest even (no flush). */
static inline uint16_t ggopt_lp_f32_to_bf16(float f) {
    uint32_t u = ggopt_lp_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

static inline float ggopt_lp_bf16_to_f32(uint16_t h) { return ggopt_lp_bits_f32((uint32_t)h << 16); }

/* IEEE binary16 -> float32, exact (subnormals, infinities, NaN payloads). */
static inline float ggopt_lp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return ggopt_lp_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {  /* zero or subnormal: m * 2^-24, exact in float32 */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return ggopt_lp_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* float32 -> binary16, round to nearest even (as F16C's vcvtps2ph and NumPy); NaN kept quiet
   with its upper payload bits. */
static inline uint16_t ggopt_lp_f32_to_f16(float f) {
    uint32_t u = ggopt_lp_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* rounds to infinity */
    if (a < 0x38800000u) {  /* below 2^-14: a subnormal or zero, in units of 2^-24 */
        float v = ggopt_lp_bits_f32(a) * 16777216.0f;          /* exact scaling */
        float r = nearbyintf(v);                               /* default mode: even ties */
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t mant = a + 0xfffu + ((a >> 13) & 1u);             /* round the low 13 bits */
    return (uint16_t)(sign | ((mant - 0x38000000u) >> 13));
}

/* ---- one step of vdpbf16ps, emulated: c + x * w, fused, DAZ in, FTZ out, RNE ---- */

static inline float ggopt_lp_daz(float v) {
    return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v;
}

/* x and w are BF16 values as float32 */
static inline float ggopt_lp_dp_step_f(float c, float x, float w) {
    if (x != x) return ggopt_lp_bits_f32(ggopt_lp_f32_bits(x) | 0x00400000u);
    if (w != w) return ggopt_lp_bits_f32(ggopt_lp_f32_bits(w) | 0x00400000u);
    if (c != c) return c;
    float r = fmaf(ggopt_lp_daz(x), ggopt_lp_daz(w), ggopt_lp_daz(c));
    if (r != r) return ggopt_lp_bits_f32(0xffc00000u);
    return ggopt_lp_daz(r);
}

static inline float ggopt_lp_dp_step(float c, uint16_t xh, uint16_t wh) {
    return ggopt_lp_dp_step_f(c, ggopt_lp_bf16_to_f32(xh), ggopt_lp_bf16_to_f32(wh));
}

/* ---- the operands ---- */

typedef struct {
    const uint16_t *w;         /* W(j, k) = w[j * w_rs + k * w_cs] (elements) */
    ptrdiff_t w_rs, w_cs;
    const float *x;            /* X(i, k) = x[i * x_rs + k * x_cs] */
    ptrdiff_t x_rs, x_cs;
    float *c;                  /* C(i, j) = c[i * c_rs + j * c_cs] */
    ptrdiff_t c_rs, c_cs;
    ptrdiff_t n, m, k;         /* i < n, j < m, k < K */
    int wtype;                 /* GGOPT_LP_BF16 or GGOPT_LP_F16 */
    int kernel;                /* GGOPT_LP_PORTABLE, GGOPT_LP_DPBF16 or GGOPT_LP_FMA */
} ggopt_lp_args;

/* The packed operands hold float32 values, one element a step (F16; BF16 on the FMA kernel,
   each pair's odd element first), or BF16 pairs, two elements a step (vdpbf16ps's words). */
static inline int ggopt_lp_widened(const ggopt_lp_args *a) {
    return a->wtype == GGOPT_LP_F16 || a->kernel == GGOPT_LP_FMA;
}

/* Steps of the reduction. */
static inline ptrdiff_t ggopt_lp_steps(const ggopt_lp_args *a) {
    if (a->wtype == GGOPT_LP_F16) return a->k;
    return a->kernel == GGOPT_LP_FMA ? 2 * ((a->k + 1) / 2) : (a->k + 1) / 2;
}

/* Element k of step s of a widened BF16 operand: pairs (2p, 2p+1), the odd one first. */
static inline ptrdiff_t ggopt_lp_step_elem(ptrdiff_t s) { return s ^ 1; }

/* A BF16 value's float32, subnormals read as zero (vdpbf16ps's DAZ), for widened packing. */
static inline uint32_t ggopt_lp_bf16_daz_bits(uint16_t h) {
    return (h & 0x7f80u) == 0 ? (uint32_t)(h & 0x8000u) << 16 : (uint32_t)h << 16;
}

/* X's row block ib (rows ib*MR ..) packed: word [p * MR + r] holds row r's step p (BF16: the
   pair's bits, 2p low; F16: the rounded value as float32). Rows past n and the pad of an odd
   K are zeros. */
static void ggopt_lp_pack_x(const ggopt_lp_args *a, ptrdiff_t ib, uint32_t *dst) {
    ptrdiff_t steps = ggopt_lp_steps(a), i0 = ib * GGOPT_LP_MR;
    for (int r = 0; r < GGOPT_LP_MR; r++) {
        ptrdiff_t i = i0 + r;
        if (i >= a->n) {
            for (ptrdiff_t p = 0; p < steps; p++) dst[p * GGOPT_LP_MR + r] = 0;
            continue;
        }
        const float *row = a->x + i * a->x_rs;
        if (a->wtype == GGOPT_LP_BF16 && ggopt_lp_widened(a)) {
            for (ptrdiff_t s = 0; s < steps; s++) {
                ptrdiff_t k = ggopt_lp_step_elem(s);
                dst[s * GGOPT_LP_MR + r] = k < a->k ?
                    ggopt_lp_bf16_daz_bits(ggopt_lp_f32_to_bf16(row[k * a->x_cs])) : 0u;
            }
        } else if (a->wtype == GGOPT_LP_BF16) {
            for (ptrdiff_t p = 0; p < steps; p++) {
                uint32_t lo = ggopt_lp_f32_to_bf16(row[2 * p * a->x_cs]);
                uint32_t hi = 2 * p + 1 < a->k ? ggopt_lp_f32_to_bf16(row[(2 * p + 1) * a->x_cs]) : 0;
                dst[p * GGOPT_LP_MR + r] = lo | (hi << 16);
            }
        } else {
            for (ptrdiff_t p = 0; p < steps; p++)
                dst[p * GGOPT_LP_MR + r] = ggopt_lp_f32_bits(
                    ggopt_lp_f16_to_f32(ggopt_lp_f32_to_f16(row[p * a->x_cs])));
        }
    }
}

/* W's panel of outputs j0 .. j0+NR-1: word [p * NR + c] holds output j0+c's step p (BF16 pair
   bits, or the F16 value as float32). Outputs past m and the pad of an odd K are zeros. */
static void ggopt_lp_pack_w(const ggopt_lp_args *a, ptrdiff_t j0, uint32_t *dst) {
    ptrdiff_t steps = ggopt_lp_steps(a), K = a->k;
    int nc = (int)(a->m - j0 < GGOPT_LP_NR ? a->m - j0 : GGOPT_LP_NR);
    if (nc < GGOPT_LP_NR)
        memset(dst, 0, (size_t)steps * GGOPT_LP_NR * sizeof(uint32_t));
    if (a->wtype == GGOPT_LP_BF16 && ggopt_lp_widened(a)) {
        for (int c = 0; c < nc; c++) {
            const uint16_t *col = a->w + (j0 + c) * a->w_rs;
            for (ptrdiff_t s = 0; s < steps; s++) {
                ptrdiff_t k = ggopt_lp_step_elem(s);
                dst[s * GGOPT_LP_NR + c] = k < K ? ggopt_lp_bf16_daz_bits(col[k * a->w_cs]) : 0u;
            }
        }
    } else if (a->wtype == GGOPT_LP_BF16) {
        if (a->w_cs == 1) {  /* rows of W along the reduction: copy 32-bit pairs */
            for (int c = 0; c < nc; c++) {
                const uint16_t *row = a->w + (j0 + c) * a->w_rs;
                ptrdiff_t p = 0;
                for (; 2 * p + 1 < K; p++) {
                    uint32_t v;
                    memcpy(&v, row + 2 * p, 4);
                    dst[p * GGOPT_LP_NR + c] = v;
                }
                if (p < steps) dst[p * GGOPT_LP_NR + c] = row[2 * p];
            }
        } else {  /* outputs along W's rows (out_prod): two rows give a step's pairs */
            for (ptrdiff_t p = 0; p < steps; p++) {
                const uint16_t *lo = a->w + j0 * a->w_rs + 2 * p * a->w_cs;
                const uint16_t *hi = lo + a->w_cs;
                int odd = 2 * p + 1 < K;
                for (int c = 0; c < nc; c++)
                    dst[p * GGOPT_LP_NR + c] = (uint32_t)lo[c * a->w_rs] |
                        (odd ? (uint32_t)hi[c * a->w_rs] << 16 : 0u);
            }
        }
    } else {
        for (int c = 0; c < nc; c++) {
            const uint16_t *col = a->w + (j0 + c) * a->w_rs;
            for (ptrdiff_t p = 0; p < steps; p++)
                dst[p * GGOPT_LP_NR + c] = ggopt_lp_f32_bits(ggopt_lp_f16_to_f32(col[p * a->w_cs]));
        }
    }
}

/* ---- micro-kernels: tile[r][c] = sums of an MR x NR tile over all steps ---- */

/* Output (r, c) of a widened BF16 tile, emulating vdpbf16ps's steps one by one: the FMA
   kernel's result for outputs that came out NaN (whose payload the emulation defines). */
static float ggopt_lp_widened_output(const uint32_t *xp, const uint32_t *wp, ptrdiff_t steps,
                                     int r, int c) {
    float s = 0.0f;
    for (ptrdiff_t p = 0; p < steps; p++)
        s = ggopt_lp_dp_step_f(s, ggopt_lp_bits_f32(xp[p * GGOPT_LP_MR + r]),
                               ggopt_lp_bits_f32(wp[p * GGOPT_LP_NR + c]));
    return s;
}

static void ggopt_lp_tile_portable(int wtype, const uint32_t *xp, const uint32_t *wp,
                                   ptrdiff_t steps, float *tile) {
    for (int r = 0; r < GGOPT_LP_MR; r++)
        for (int c = 0; c < GGOPT_LP_NR; c++) {
            float s = 0.0f;
            if (wtype == GGOPT_LP_BF16) {
                for (ptrdiff_t p = 0; p < steps; p++) {
                    uint32_t xv = xp[p * GGOPT_LP_MR + r], wv = wp[p * GGOPT_LP_NR + c];
                    s = ggopt_lp_dp_step(s, (uint16_t)(xv >> 16), (uint16_t)(wv >> 16));
                    s = ggopt_lp_dp_step(s, (uint16_t)xv, (uint16_t)wv);
                }
            } else {
                for (ptrdiff_t p = 0; p < steps; p++)
                    s = fmaf(ggopt_lp_bits_f32(xp[p * GGOPT_LP_MR + r]),
                             ggopt_lp_bits_f32(wp[p * GGOPT_LP_NR + c]), s);
            }
            tile[r * GGOPT_LP_NR + c] = s;
        }
}

#if GGOPT_LP_X86
#define GGOPT_LP_TILE_BODY(STEP)                                                             \
    __m512 acc[GGOPT_LP_MR][GGOPT_LP_NV];                                                    \
    for (int r = 0; r < GGOPT_LP_MR; r++)                                                    \
        for (int v = 0; v < GGOPT_LP_NV; v++) acc[r][v] = _mm512_setzero_ps();               \
    for (ptrdiff_t p = 0; p < steps; p++) {                                                  \
        const uint32_t *xs = xp + p * GGOPT_LP_MR;                                           \
        const uint32_t *ws = wp + p * GGOPT_LP_NR;                                           \
        __m512i w0 = _mm512_loadu_si512(ws), w1 = _mm512_loadu_si512(ws + 16),               \
                w2 = _mm512_loadu_si512(ws + 32);                                            \
        for (int r = 0; r < GGOPT_LP_MR; r++) {                                              \
            __m512i xb = _mm512_set1_epi32((int)xs[r]);                                      \
            acc[r][0] = STEP(acc[r][0], xb, w0);                                             \
            acc[r][1] = STEP(acc[r][1], xb, w1);                                             \
            acc[r][2] = STEP(acc[r][2], xb, w2);                                             \
        }                                                                                    \
    }                                                                                        \
    for (int r = 0; r < GGOPT_LP_MR; r++)                                                    \
        for (int v = 0; v < GGOPT_LP_NV; v++)                                                \
            _mm512_storeu_ps(tile + r * GGOPT_LP_NR + 16 * v, acc[r][v]);

#define GGOPT_LP_STEP_DP(c, x, w) _mm512_dpbf16_ps((c), (__m512bh)(x), (__m512bh)(w))
#define GGOPT_LP_STEP_FMA(c, x, w) \
    _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(w), (c))

__attribute__((target("avx512f,avx512bf16")))
static void ggopt_lp_tile_bf16_hw(const uint32_t *xp, const uint32_t *wp, ptrdiff_t steps,
                                  float *tile) {
    GGOPT_LP_TILE_BODY(GGOPT_LP_STEP_DP)
}

__attribute__((target("avx512f")))
static void ggopt_lp_tile_f16_hw(const uint32_t *xp, const uint32_t *wp, ptrdiff_t steps,
                                 float *tile) {
    GGOPT_LP_TILE_BODY(GGOPT_LP_STEP_FMA)
}
#endif

/* 1 when this CPU runs `kernel` (DPBF16: AVX-512 BF16; FMA: AVX-512F; PORTABLE: any). */
static int ggopt_lp_can_run(int kernel) {
    if (kernel == GGOPT_LP_PORTABLE) return 1;
#if GGOPT_LP_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return 0;
    return kernel == GGOPT_LP_FMA || (kernel == GGOPT_LP_DPBF16 &&
                                      __builtin_cpu_supports("avx512bf16"));
#else
    return 0;
#endif
}

/* The fastest kernel for wtype on this CPU. BF16: vdpbf16ps on AMD (Zen 4 runs it at twice
   the F32 FMA rate), else the FMA kernel on widened values (an Intel Xeon with AVX-512 BF16
   runs vdpbf16ps at half its FMA rate), else portable; F16: FMA, else portable. */
static int ggopt_lp_best_kernel(int wtype) {
#if GGOPT_LP_X86
    __builtin_cpu_init();
    if (wtype == GGOPT_LP_BF16 && __builtin_cpu_is("amd") && ggopt_lp_can_run(GGOPT_LP_DPBF16))
        return GGOPT_LP_DPBF16;
#endif
    (void)wtype;
    return ggopt_lp_can_run(GGOPT_LP_FMA) ? GGOPT_LP_FMA : GGOPT_LP_PORTABLE;
}

static void ggopt_lp_tile(const ggopt_lp_args *a, const uint32_t *xp, const uint32_t *wp,
                          ptrdiff_t steps, float *tile) {
#if GGOPT_LP_X86
    if (a->kernel == GGOPT_LP_DPBF16) {
        ggopt_lp_tile_bf16_hw(xp, wp, steps, tile);
        return;
    }
    if (a->kernel == GGOPT_LP_FMA) {
        ggopt_lp_tile_f16_hw(xp, wp, steps, tile);
        if (a->wtype == GGOPT_LP_BF16)   /* NaN payloads as vdpbf16ps makes them */
            for (int i = 0; i < GGOPT_LP_MR * GGOPT_LP_NR; i++)
                if (tile[i] != tile[i])
                    tile[i] = ggopt_lp_widened_output(xp, wp, steps, i / GGOPT_LP_NR,
                                                      i % GGOPT_LP_NR);
        return;
    }
#endif
    if (a->wtype == GGOPT_LP_BF16 && ggopt_lp_widened(a)) {  /* not reached: FMA is x86 */
        for (int i = 0; i < GGOPT_LP_MR * GGOPT_LP_NR; i++)
            tile[i] = ggopt_lp_widened_output(xp, wp, steps, i / GGOPT_LP_NR, i % GGOPT_LP_NR);
        return;
    }
    ggopt_lp_tile_portable(a->wtype, xp, wp, steps, tile);
}

/* The FMA kernel on BF16 runs with flush-to-zero and denormals-are-zero (vdpbf16ps's FTZ and
   DAZ); the caller's MXCSR is restored after. */
static inline unsigned ggopt_lp_enter_ftz(const ggopt_lp_args *a) {
#if GGOPT_LP_X86
    if (a->kernel == GGOPT_LP_FMA && a->wtype == GGOPT_LP_BF16) {
        unsigned saved = _mm_getcsr();
        _mm_setcsr(saved | 0x8040u);
        return saved;
    }
#endif
    (void)a;
    return 0;
}

static inline void ggopt_lp_leave_ftz(const ggopt_lp_args *a, unsigned saved) {
#if GGOPT_LP_X86
    if (a->kernel == GGOPT_LP_FMA && a->wtype == GGOPT_LP_BF16) _mm_setcsr(saved);
#endif
    (void)a;
    (void)saved;
}

/* C = r(X) W^T on n_threads threads with a->kernel, which the caller has checked with
   ggopt_lp_can_run. Returns 0, or -1 when scratch memory ran out (C is then partly
   written). */
static int ggopt_lp_gemm(const ggopt_lp_args *a, int n_threads) {
    if (a->n <= 0 || a->m <= 0) return 0;
    ptrdiff_t steps = ggopt_lp_steps(a);
    ptrdiff_t n_blocks = (a->n + GGOPT_LP_MR - 1) / GGOPT_LP_MR;
    ptrdiff_t n_panels = (a->m + GGOPT_LP_NR - 1) / GGOPT_LP_NR;
    size_t xwords = (size_t)(steps > 0 ? steps : 1) * GGOPT_LP_MR;
    size_t wwords = (size_t)(steps > 0 ? steps : 1) * GGOPT_LP_NR;
    uint32_t *xpack = (uint32_t *)aligned_alloc(64, ((xwords * n_blocks * 4 + 63) / 64) * 64);
    int failed = xpack == NULL;
    if (failed) return -1;
    if (n_threads > n_panels) n_threads = (int)n_panels;
    #pragma omp parallel num_threads(n_threads)
    {
        #pragma omp for schedule(static)
        for (ptrdiff_t ib = 0; ib < n_blocks; ib++) ggopt_lp_pack_x(a, ib, xpack + ib * xwords);
        uint32_t *wpack = (uint32_t *)aligned_alloc(64, ((wwords * 4 + 63) / 64) * 64);
        float tile[GGOPT_LP_MR * GGOPT_LP_NR];
        if (wpack == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        unsigned csr = ggopt_lp_enter_ftz(a);
        #pragma omp for schedule(static)
        for (ptrdiff_t jp = 0; jp < n_panels; jp++) {
            if (wpack == NULL) continue;
            ptrdiff_t j0 = jp * GGOPT_LP_NR;
            int nc = (int)(a->m - j0 < GGOPT_LP_NR ? a->m - j0 : GGOPT_LP_NR);
            ggopt_lp_pack_w(a, j0, wpack);
            for (ptrdiff_t ib = 0; ib < n_blocks; ib++) {
                ggopt_lp_tile(a, xpack + ib * xwords, wpack, steps, tile);
                ptrdiff_t i0 = ib * GGOPT_LP_MR;
                int nr = (int)(a->n - i0 < GGOPT_LP_MR ? a->n - i0 : GGOPT_LP_MR);
                for (int r = 0; r < nr; r++) {
                    float *crow = a->c + (i0 + r) * a->c_rs + j0 * a->c_cs;
                    const float *t = tile + r * GGOPT_LP_NR;
                    if (a->c_cs == 1) memcpy(crow, t, (size_t)nc * sizeof(float));
                    else for (int c = 0; c < nc; c++) crow[c * a->c_cs] = t[c];
                }
            }
        }
        ggopt_lp_leave_ftz(a, csr);
        free(wpack);
    }
    free(xpack);
    return failed ? -1 : 0;
}

#endif
