/* Low-precision products as ggml's CPU backend defines them: C(i, j) = sum_k r(X(i, k)) W(j, k)
   with W BF16 or F16, X float32 rounded to W's type (ggml's vec_dot_type, round to nearest
   even) and F32 sums. Included by _lowp.pyx.

   A packed, register-blocked GEMM: X is rounded and packed once into blocks of GGOPT_LP_MR rows,
   W into panels of GGOPT_LP_NR outputs (a thread's scratch per pass, or all panels packed
   beforehand by ggopt_lp_pack_all for a weight that does not change), and a micro-kernel keeps
   an MR x NR tile of sums in registers over a block of GGOPT_LP_KC steps (partial sums stored
   exactly between blocks; a long reduction runs in passes of GGOPT_LP_KPASS steps, the partial
   sums kept in C). Threads share out the panels; every output is computed in one fixed order,
   so its bits depend neither on the thread count nor on the blocking.

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
#define GGOPT_LP_AVX2 3        /* the FMA kernel with 256-bit vectors */

/* ---- conversions ---- */

static inline uint32_t ggopt_lp_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ggopt_lp_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ggml_compute_fp32_to_bf16: NaN made quiet, else round to nearest even (no flush). */
static inline uint16_t ggopt_lp_f32_to_bf16(float f) {
    uint32_t u = ggopt_lp_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* ggopt_lp_f32_to_bf16 over n values on n_threads threads (each value alone: the bits do not
   depend on the thread count). Branch-free so that it vectorizes (SSE2 at least). */
static void ggopt_lp_f32_to_bf16_n(const float *src, uint16_t *dst, ptrdiff_t n, int n_threads) {
    const uint32_t *u = (const uint32_t *)(const void *)src;
    #pragma omp parallel for schedule(static) num_threads(n_threads) if (n >= 65536)
    for (ptrdiff_t i = 0; i < n; i++) {
        uint32_t v = u[i];
        uint32_t rounded = (v + (0x7fffu + ((v >> 16) & 1u))) >> 16;
        uint32_t quiet = (v >> 16) | 64u;
        dst[i] = (uint16_t)((v & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
    }
}

static void ggopt_lp_bf16_to_f32_n(const uint16_t *src, float *dst, ptrdiff_t n, int n_threads) {
    uint32_t *u = (uint32_t *)(void *)dst;
    #pragma omp parallel for schedule(static) num_threads(n_threads) if (n >= 65536)
    for (ptrdiff_t i = 0; i < n; i++) u[i] = (uint32_t)src[i] << 16;
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
    int kernel;                /* GGOPT_LP_PORTABLE, _DPBF16, _FMA or _AVX2 */
    const uint32_t *wpacked;   /* NULL, or W's panels packed beforehand (ggopt_lp_pack_all) */
} ggopt_lp_args;

/* W's packed steps: BF16 pairs (k = 2p, 2p+1 in one word, 2p low), or F16 values as float32.
   Every kernel packs W so (the FMA kernel widens a block of a panel just before using it). */
static inline ptrdiff_t ggopt_lp_wsteps(int wtype, ptrdiff_t k) {
    return wtype == GGOPT_LP_F16 ? k : (k + 1) / 2;
}

/* The FMA kernels (AVX-512F or AVX2) on BF16: X packed widened (two float32 steps a pair,
   the odd element first), W's pairs widened per block. */
static inline int ggopt_lp_widened_bf16(const ggopt_lp_args *a) {
    return a->wtype == GGOPT_LP_BF16 && (a->kernel == GGOPT_LP_FMA || a->kernel == GGOPT_LP_AVX2);
}

/* Words of X per packed step of W, per row. */
static inline ptrdiff_t ggopt_lp_xper(const ggopt_lp_args *a) {
    return ggopt_lp_widened_bf16(a) ? 2 : 1;
}

/* The packed words of all of W's panels (ggopt_lp_pack_all). */
static inline size_t ggopt_lp_packed_words(int wtype, ptrdiff_t m, ptrdiff_t k) {
    ptrdiff_t panels = (m + GGOPT_LP_NR - 1) / GGOPT_LP_NR;
    return (size_t)panels * (size_t)ggopt_lp_wsteps(wtype, k) * GGOPT_LP_NR;
}

/* A BF16 value's float32 bits, subnormals read as zero (vdpbf16ps's DAZ). */
static inline uint32_t ggopt_lp_bf16_daz_bits(uint16_t h) {
    return (h & 0x7f80u) == 0 ? (uint32_t)(h & 0x8000u) << 16 : (uint32_t)h << 16;
}

static int ggopt_lp_can_run(int kernel);

#if GGOPT_LP_X86
/* The widened BF16 packing of 8 full rows (row r at x + r * x_rs, unit stride) for the steps
   below k8 (a multiple of 8 <= K): each element rounded to BF16 (ggopt_lp_f32_to_bf16), its
   subnormals zeroed (ggopt_lp_bf16_daz_bits), the pairs swapped (step s holds element s ^ 1),
   then 8 x 8 blocks transposed so that step s's 8 rows are contiguous. The scalar rule's bits. */
__attribute__((target("avx2")))
static void ggopt_lp_pack_x_widened_avx2(const float *x, ptrdiff_t x_rs, ptrdiff_t k8,
                                         uint32_t *dst) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u), one = _mm256_set1_epi32(1);
    const __m256i half = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x00400000);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u), zero = _mm256_setzero_si256();
    for (ptrdiff_t s0 = 0; s0 < k8; s0 += 8) {
        __m256i v[8];
        for (int r = 0; r < 8; r++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x + r * x_rs + s0));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            __m256i rounded = _mm256_and_si256(
                _mm256_add_epi32(u, _mm256_add_epi32(half, odd)), hi);
            __m256i q = _mm256_and_si256(_mm256_or_si256(u, quiet), hi);
            __m256i b = _mm256_blendv_epi8(rounded, q, nan);
            __m256i sub = _mm256_cmpeq_epi32(_mm256_and_si256(b, inf), zero);
            b = _mm256_blendv_epi8(b, _mm256_and_si256(b, sign), sub);
            v[r] = _mm256_shuffle_epi32(b, 0xB1);  /* step s holds element s ^ 1 */
        }
        /* transpose: t[j] = step s0 + j of rows 0..7 */
        __m256i a0 = _mm256_unpacklo_epi32(v[0], v[1]), a1 = _mm256_unpackhi_epi32(v[0], v[1]);
        __m256i a2 = _mm256_unpacklo_epi32(v[2], v[3]), a3 = _mm256_unpackhi_epi32(v[2], v[3]);
        __m256i a4 = _mm256_unpacklo_epi32(v[4], v[5]), a5 = _mm256_unpackhi_epi32(v[4], v[5]);
        __m256i a6 = _mm256_unpacklo_epi32(v[6], v[7]), a7 = _mm256_unpackhi_epi32(v[6], v[7]);
        __m256i b0 = _mm256_unpacklo_epi64(a0, a2), b1 = _mm256_unpackhi_epi64(a0, a2);
        __m256i b2 = _mm256_unpacklo_epi64(a1, a3), b3 = _mm256_unpackhi_epi64(a1, a3);
        __m256i b4 = _mm256_unpacklo_epi64(a4, a6), b5 = _mm256_unpackhi_epi64(a4, a6);
        __m256i b6 = _mm256_unpacklo_epi64(a5, a7), b7 = _mm256_unpackhi_epi64(a5, a7);
        __m256i t[8] = {
            _mm256_permute2x128_si256(b0, b4, 0x20), _mm256_permute2x128_si256(b1, b5, 0x20),
            _mm256_permute2x128_si256(b2, b6, 0x20), _mm256_permute2x128_si256(b3, b7, 0x20),
            _mm256_permute2x128_si256(b0, b4, 0x31), _mm256_permute2x128_si256(b1, b5, 0x31),
            _mm256_permute2x128_si256(b2, b6, 0x31), _mm256_permute2x128_si256(b3, b7, 0x31)};
        for (int j = 0; j < 8; j++)
            _mm256_storeu_si256((__m256i *)(void *)(dst + (s0 + j) * GGOPT_LP_MR), t[j]);
    }
}
#endif

/* X's row block ib (rows ib*MR ..) packed: word [s * MR + r] holds row r's step s (BF16: the
   pair's bits, 2p low; widened BF16: steps 2p, 2p+1 hold elements 2p+1, 2p as float32, the
   subnormals zeroed; F16: the rounded value as float32). Rows past n and the pad of an odd K
   are zeros. */
static void ggopt_lp_pack_x(const ggopt_lp_args *a, ptrdiff_t ib, uint32_t *dst) {
    ptrdiff_t steps = ggopt_lp_wsteps(a->wtype, a->k) * ggopt_lp_xper(a), i0 = ib * GGOPT_LP_MR;
    ptrdiff_t done = 0;  /* steps packed by the vector code, for every row */
#if GGOPT_LP_X86
    if (ggopt_lp_widened_bf16(a) && a->x_cs == 1 && i0 + GGOPT_LP_MR <= a->n &&
        ggopt_lp_can_run(GGOPT_LP_AVX2)) {
        done = a->k - a->k % 8;
        ggopt_lp_pack_x_widened_avx2(a->x + i0 * a->x_rs, a->x_rs, done, dst);
    }
#endif
    for (int r = 0; r < GGOPT_LP_MR; r++) {
        ptrdiff_t i = i0 + r;
        if (i >= a->n) {
            for (ptrdiff_t p = 0; p < steps; p++) dst[p * GGOPT_LP_MR + r] = 0;
            continue;
        }
        const float *row = a->x + i * a->x_rs;
        if (ggopt_lp_widened_bf16(a)) {
            for (ptrdiff_t s = done; s < steps; s++) {
                ptrdiff_t k = s ^ 1;
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

/* W's panel of outputs j0 .. j0+NR-1, steps p_lo .. p_hi-1: word [(p - p_lo) * NR + c] holds
   output j0+c's step p (BF16 pair bits, or the F16 value as float32). Outputs past m and the
   pad of an odd K are zeros. */
static void ggopt_lp_pack_w(const ggopt_lp_args *a, ptrdiff_t j0, ptrdiff_t p_lo,
                            ptrdiff_t p_hi, uint32_t *dst) {
    ptrdiff_t steps = p_hi - p_lo, K = a->k;
    int nc = (int)(a->m - j0 < GGOPT_LP_NR ? a->m - j0 : GGOPT_LP_NR);
    if (nc < GGOPT_LP_NR)
        memset(dst, 0, (size_t)steps * GGOPT_LP_NR * sizeof(uint32_t));
    if (a->wtype == GGOPT_LP_BF16) {
        if (a->w_cs == 1) {  /* rows of W along the reduction: copy 32-bit pairs */
            for (int c = 0; c < nc; c++) {
                const uint16_t *row = a->w + (j0 + c) * a->w_rs;
                for (ptrdiff_t p = p_lo; p < p_hi; p++) {
                    uint32_t v = row[2 * p];
                    if (2 * p + 1 < K) memcpy(&v, row + 2 * p, 4);
                    dst[(p - p_lo) * GGOPT_LP_NR + c] = v;
                }
            }
        } else {  /* outputs along W's rows (out_prod): two rows give a step's pairs */
            for (ptrdiff_t p = p_lo; p < p_hi; p++) {
                const uint16_t *lo = a->w + j0 * a->w_rs + 2 * p * a->w_cs;
                const uint16_t *hi = lo + a->w_cs;
                uint32_t *d = dst + (p - p_lo) * GGOPT_LP_NR;
                if (2 * p + 1 < K) {
                    if (a->w_rs == 1)
                        for (int c = 0; c < nc; c++) d[c] = (uint32_t)lo[c] | (uint32_t)hi[c] << 16;
                    else
                        for (int c = 0; c < nc; c++)
                            d[c] = (uint32_t)lo[c * a->w_rs] | (uint32_t)hi[c * a->w_rs] << 16;
                } else {
                    for (int c = 0; c < nc; c++) d[c] = lo[c * a->w_rs];
                }
            }
        }
    } else {
        for (int c = 0; c < nc; c++) {
            const uint16_t *col = a->w + (j0 + c) * a->w_rs;
            for (ptrdiff_t p = p_lo; p < p_hi; p++)
                dst[(p - p_lo) * GGOPT_LP_NR + c] =
                    ggopt_lp_f32_bits(ggopt_lp_f16_to_f32(col[p * a->w_cs]));
        }
    }
}

#if !GGOPT_LP_X86
/* Widened BF16: pairs [p * NR + c] of a panel's block become float32 steps 2p (element 2p+1)
   and 2p+1 (element 2p), subnormals zeroed. */
static void ggopt_lp_widen_w(const uint32_t *pairs, ptrdiff_t psteps, uint32_t *dst) {
    for (ptrdiff_t p = 0; p < psteps; p++)
        for (int c = 0; c < GGOPT_LP_NR; c++) {
            uint32_t v = pairs[p * GGOPT_LP_NR + c];
            dst[2 * p * GGOPT_LP_NR + c] = ggopt_lp_bf16_daz_bits((uint16_t)(v >> 16));
            dst[(2 * p + 1) * GGOPT_LP_NR + c] = ggopt_lp_bf16_daz_bits((uint16_t)v);
        }
}
#endif

/* ---- micro-kernels: tile[r][c] += the sums of an MR x NR tile over `steps` steps ---- */

/* Output (i, j) of a BF16 product, vdpbf16ps's steps emulated one by one from the operands:
   the FMA kernel's result for outputs that came out NaN (whose payload the emulation
   defines). */
static float ggopt_lp_emulated_output(const ggopt_lp_args *a, ptrdiff_t i, ptrdiff_t j) {
    float s = 0.0f;
    const float *xr = a->x + i * a->x_rs;
    const uint16_t *wr = a->w + j * a->w_rs;
    for (ptrdiff_t k = 0; k < a->k; k += 2) {
        if (k + 1 < a->k)
            s = ggopt_lp_dp_step(s, ggopt_lp_f32_to_bf16(xr[(k + 1) * a->x_cs]),
                                 wr[(k + 1) * a->w_cs]);
        s = ggopt_lp_dp_step(s, ggopt_lp_f32_to_bf16(xr[k * a->x_cs]), wr[k * a->w_cs]);
    }
    return s;
}

static void ggopt_lp_tile_portable(int wtype, const uint32_t *xp, const uint32_t *wp,
                                   ptrdiff_t steps, float *tile) {
    for (int r = 0; r < GGOPT_LP_MR; r++)
        for (int c = 0; c < GGOPT_LP_NR; c++) {
            float s = tile[r * GGOPT_LP_NR + c];
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
        for (int v = 0; v < GGOPT_LP_NV; v++)                                                \
            acc[r][v] = _mm512_loadu_ps(tile + r * GGOPT_LP_NR + 16 * v);                    \
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

/* ggopt_lp_widen_w on AVX-512F. */
__attribute__((target("avx512f")))
static void ggopt_lp_widen_w_hw(const uint32_t *pairs, ptrdiff_t psteps, uint32_t *dst) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u), ex = _mm512_set1_epi32(0x7f800000);
    const __m512i sg = _mm512_set1_epi32((int)0x80000000u);
    for (ptrdiff_t p = 0; p < psteps; p++)
        for (int v = 0; v < GGOPT_LP_NV; v++) {
            __m512i w = _mm512_loadu_si512(pairs + p * GGOPT_LP_NR + 16 * v);
            __m512i odd = _mm512_and_si512(w, hi), even = _mm512_slli_epi32(w, 16);
            __mmask16 so = _mm512_testn_epi32_mask(odd, ex), se = _mm512_testn_epi32_mask(even, ex);
            odd = _mm512_mask_and_epi32(odd, so, odd, sg);
            even = _mm512_mask_and_epi32(even, se, even, sg);
            _mm512_storeu_si512(dst + 2 * p * GGOPT_LP_NR + 16 * v, odd);
            _mm512_storeu_si512(dst + (2 * p + 1) * GGOPT_LP_NR + 16 * v, even);
        }
}

/* The FMA kernel on AVX2: the MR x NR tile in quarters of 4 rows x 24 outputs (12 sums in
   the 16 registers), each quarter over chunks of GGOPT_LP_A2_KS steps (its operands stay in
   the first-level cache while the four quarters take them). Every output gets the same fused
   step per step, in the same order, as in the AVX-512F kernel: the same bits. */
#define GGOPT_LP_A2_KS 64

#define GGOPT_LP_A2_ROW(r)                                                                   \
    do {                                                                                     \
        __m256 xb = _mm256_broadcast_ss(xs + (r));                                           \
        acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);                                      \
        acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);                                      \
        acc[r][2] = _mm256_fmadd_ps(xb, w2, acc[r][2]);                                      \
    } while (0)

__attribute__((target("avx2,fma")))
static void ggopt_lp_tile_fma_avx2(const uint32_t *xp, const uint32_t *wp, ptrdiff_t steps,
                                   float *tile) {
    for (ptrdiff_t s0 = 0; s0 < steps; s0 += GGOPT_LP_A2_KS) {
        ptrdiff_t s1 = steps - s0 < GGOPT_LP_A2_KS ? steps : s0 + GGOPT_LP_A2_KS;
        for (int r0 = 0; r0 < GGOPT_LP_MR; r0 += 4)
            for (int c0 = 0; c0 < GGOPT_LP_NR; c0 += 24) {
                float *t = tile + r0 * GGOPT_LP_NR + c0;
                __m256 acc[4][3];
                for (int r = 0; r < 4; r++)
                    for (int v = 0; v < 3; v++)
                        acc[r][v] = _mm256_loadu_ps(t + r * GGOPT_LP_NR + 8 * v);
                for (ptrdiff_t p = s0; p < s1; p++) {
                    const float *xs = (const float *)(const void *)(xp + p * GGOPT_LP_MR + r0);
                    const float *ws = (const float *)(const void *)(wp + p * GGOPT_LP_NR + c0);
                    __m256 w0 = _mm256_loadu_ps(ws), w1 = _mm256_loadu_ps(ws + 8),
                           w2 = _mm256_loadu_ps(ws + 16);
                    GGOPT_LP_A2_ROW(0);
                    GGOPT_LP_A2_ROW(1);
                    GGOPT_LP_A2_ROW(2);
                    GGOPT_LP_A2_ROW(3);
                }
                for (int r = 0; r < 4; r++)
                    for (int v = 0; v < 3; v++)
                        _mm256_storeu_ps(t + r * GGOPT_LP_NR + 8 * v, acc[r][v]);
            }
    }
}

/* ggopt_lp_widen_w on AVX2. */
__attribute__((target("avx2")))
static void ggopt_lp_widen_w_avx2(const uint32_t *pairs, ptrdiff_t psteps, uint32_t *dst) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u), ex = _mm256_set1_epi32(0x7f800000);
    const __m256i sg = _mm256_set1_epi32((int)0x80000000u), zero = _mm256_setzero_si256();
    for (ptrdiff_t p = 0; p < psteps; p++)
        for (int v = 0; v < GGOPT_LP_NR / 8; v++) {
            const uint32_t *src = pairs + p * GGOPT_LP_NR + 8 * v;
            uint32_t *d_odd = dst + 2 * p * GGOPT_LP_NR + 8 * v, *d_even = d_odd + GGOPT_LP_NR;
            __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)src);
            __m256i odd = _mm256_and_si256(w, hi), even = _mm256_slli_epi32(w, 16);
            __m256i so = _mm256_cmpeq_epi32(_mm256_and_si256(odd, ex), zero);
            __m256i se = _mm256_cmpeq_epi32(_mm256_and_si256(even, ex), zero);
            odd = _mm256_blendv_epi8(odd, _mm256_and_si256(odd, sg), so);
            even = _mm256_blendv_epi8(even, _mm256_and_si256(even, sg), se);
            _mm256_storeu_si256((__m256i *)(void *)d_odd, odd);
            _mm256_storeu_si256((__m256i *)(void *)d_even, even);
        }
}
#endif

/* 1 when this CPU runs `kernel` (DPBF16: AVX-512 BF16; FMA: AVX-512F; AVX2: AVX2 and FMA;
   PORTABLE: any). */
static int ggopt_lp_can_run(int kernel) {
    if (kernel == GGOPT_LP_PORTABLE) return 1;
#if GGOPT_LP_X86
    __builtin_cpu_init();
    if (kernel == GGOPT_LP_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!__builtin_cpu_supports("avx512f")) return 0;
    return kernel == GGOPT_LP_FMA || (kernel == GGOPT_LP_DPBF16 &&
                                      __builtin_cpu_supports("avx512bf16"));
#else
    return 0;
#endif
}

/* The fastest kernel for wtype on this CPU. BF16: vdpbf16ps on AMD (Zen 4 runs it at twice
   the F32 FMA rate), else the FMA kernel on widened values (an Intel Xeon with AVX-512 BF16
   runs vdpbf16ps at half its FMA rate), else the FMA kernel on AVX2, else portable; F16: FMA
   (AVX-512F, else AVX2), else portable. */
static int ggopt_lp_best_kernel(int wtype) {
#if GGOPT_LP_X86
    __builtin_cpu_init();
    if (wtype == GGOPT_LP_BF16 && __builtin_cpu_is("amd") && ggopt_lp_can_run(GGOPT_LP_DPBF16))
        return GGOPT_LP_DPBF16;
#endif
    (void)wtype;
    if (ggopt_lp_can_run(GGOPT_LP_FMA)) return GGOPT_LP_FMA;
    return ggopt_lp_can_run(GGOPT_LP_AVX2) ? GGOPT_LP_AVX2 : GGOPT_LP_PORTABLE;
}

/* tile += the steps of xp and wp (both packed for the tile: widened BF16 steps for the FMA
   kernel on BF16). */
static void ggopt_lp_tile(const ggopt_lp_args *a, const uint32_t *xp, const uint32_t *wp,
                          ptrdiff_t steps, float *tile) {
#if GGOPT_LP_X86
    if (a->kernel == GGOPT_LP_DPBF16 && a->wtype == GGOPT_LP_BF16) {
        ggopt_lp_tile_bf16_hw(xp, wp, steps, tile);
        return;
    }
    if (a->kernel == GGOPT_LP_AVX2) {
        ggopt_lp_tile_fma_avx2(xp, wp, steps, tile);
        return;
    }
    if (a->kernel != GGOPT_LP_PORTABLE) {  /* FMA (and DPBF16 on F16) */
        ggopt_lp_tile_f16_hw(xp, wp, steps, tile);
        return;
    }
#endif
    ggopt_lp_tile_portable(a->wtype, xp, wp, steps, tile);
}

/* The FMA kernel on BF16 runs with flush-to-zero and denormals-are-zero (vdpbf16ps's FTZ and
   DAZ); the caller's MXCSR is restored after. */
static inline unsigned ggopt_lp_enter_ftz(const ggopt_lp_args *a) {
#if GGOPT_LP_X86
    if (ggopt_lp_widened_bf16(a)) {
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
    if (ggopt_lp_widened_bf16(a)) _mm_setcsr(saved);
#endif
    (void)a;
    (void)saved;
}

/* W's panels, all of them, into dst (ggopt_lp_packed_words(wtype, m, k) words): what the
   product packs per call, kept with a weight that does not change (a->wpacked). */
static void ggopt_lp_pack_all(const ggopt_lp_args *a, uint32_t *dst, int n_threads) {
    ptrdiff_t n_panels = (a->m + GGOPT_LP_NR - 1) / GGOPT_LP_NR;
    size_t pw = (size_t)ggopt_lp_wsteps(a->wtype, a->k) * GGOPT_LP_NR;
    #pragma omp parallel for schedule(static) num_threads(n_threads)
    for (ptrdiff_t jp = 0; jp < n_panels; jp++)
        ggopt_lp_pack_w(a, jp * GGOPT_LP_NR, 0, ggopt_lp_wsteps(a->wtype, a->k), dst + jp * pw);
}

/* A 64-bit hash of W's bits (rows x cols elements, W(i, j) = w[i * rs + j * cs]), the same
   for any thread count: each row hashed alone (four interleaved multiply-rotate lanes), the
   row hashes combined in order. What a cache of packed panels checks before each use. */
static inline uint64_t ggopt_lp_mix(uint64_t acc, uint64_t v) {
    acc += v * 0xC2B2AE3D27D4EB4FULL;
    acc = (acc << 31) | (acc >> 33);
    return acc * 0x9E3779B185EBCA87ULL;
}

static inline uint64_t ggopt_lp_final(uint64_t h) {
    h ^= h >> 33; h *= 0xFF51AFD7ED558CCDULL; h ^= h >> 33; h *= 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 33);
}

static uint64_t ggopt_lp_hash_row(const uint16_t *row, ptrdiff_t cols, ptrdiff_t cs) {
    uint64_t l[4] = {1, 2, 3, 4};
    ptrdiff_t j = 0;
    for (; j + 16 <= cols; j += 16)  /* lane q: elements j+4q .. j+4q+3, the first lowest */
        for (int q = 0; q < 4; q++) {
            uint64_t v = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            if (cs == 1) memcpy(&v, row + j + 4 * q, 8);
            else
#endif
            {
                for (int e = 0; e < 4; e++) v |= (uint64_t)row[(j + 4 * q + e) * cs] << (16 * e);
            }
            l[q] = ggopt_lp_mix(l[q], v);
        }
    for (; j < cols; j++) l[j & 3] = ggopt_lp_mix(l[j & 3], (uint64_t)row[j * cs] + 0x10000u);
    uint64_t h = (uint64_t)cols;
    for (int q = 0; q < 4; q++) h = ggopt_lp_mix(h, l[q]);
    return ggopt_lp_final(h);
}

static int ggopt_lp_hash(const uint16_t *w, ptrdiff_t rows, ptrdiff_t cols, ptrdiff_t rs,
                         ptrdiff_t cs, int n_threads, unsigned long long *out) {
    uint64_t *rh = (uint64_t *)malloc((size_t)(rows > 0 ? rows : 1) * 8);
    if (rh == NULL) return -1;
    #pragma omp parallel for schedule(static) num_threads(n_threads)
    for (ptrdiff_t i = 0; i < rows; i++) rh[i] = ggopt_lp_hash_row(w + i * rs, cols, cs);
    uint64_t h = ggopt_lp_mix((uint64_t)rows, (uint64_t)cols);
    for (ptrdiff_t i = 0; i < rows; i++) h = ggopt_lp_mix(h, rh[i]);
    free(rh);
    *out = (unsigned long long)ggopt_lp_final(h);
    return 0;
}

/* Packed steps of W per block of the reduction (a panel's block and X's stay in the second-level
   cache), and per pass over C (a long reduction is cut into passes, the partial sums kept in C
   exactly, so that X's part of a pass stays in cache across the panels). */
#define GGOPT_LP_KC 256
#define GGOPT_LP_KPASS 512

/* C = r(X) W^T on n_threads threads with a->kernel, which the caller has checked with
   ggopt_lp_can_run. Each output is summed over the whole reduction in order, block after
   block (partial sums kept exactly in float32 between blocks and passes). Returns 0, or -1
   when scratch memory ran out (C is then partly written). */
static int ggopt_lp_gemm(const ggopt_lp_args *a, int n_threads) {
    if (a->n <= 0 || a->m <= 0) return 0;
    ptrdiff_t wsteps = ggopt_lp_wsteps(a->wtype, a->k), xper = ggopt_lp_xper(a);
    int widened = ggopt_lp_widened_bf16(a);
    ptrdiff_t n_blocks = (a->n + GGOPT_LP_MR - 1) / GGOPT_LP_MR;
    ptrdiff_t n_panels = (a->m + GGOPT_LP_NR - 1) / GGOPT_LP_NR;
    ptrdiff_t kpass = wsteps <= 2 * GGOPT_LP_KPASS ? wsteps : GGOPT_LP_KPASS;
    size_t xwords = (size_t)(wsteps > 0 ? wsteps : 1) * xper * GGOPT_LP_MR;
    size_t pwords = (size_t)(wsteps > 0 ? wsteps : 1) * GGOPT_LP_NR;
    size_t bwords = (size_t)GGOPT_LP_KC * 2 * GGOPT_LP_NR;
    size_t twords = (size_t)n_blocks * GGOPT_LP_MR * GGOPT_LP_NR;
    uint32_t *xpack = (uint32_t *)aligned_alloc(64, ((xwords * n_blocks * 4 + 63) / 64) * 64);
    int failed = xpack == NULL;
    if (failed) return -1;
    if (n_threads > n_panels) n_threads = (int)n_panels;
    #pragma omp parallel num_threads(n_threads)
    {
        #pragma omp for schedule(static)
        for (ptrdiff_t ib = 0; ib < n_blocks; ib++) ggopt_lp_pack_x(a, ib, xpack + ib * xwords);
        size_t kwords = (size_t)(kpass > 0 ? kpass : 1) * GGOPT_LP_NR;
        uint32_t *wpack = a->wpacked ? NULL :
            (uint32_t *)aligned_alloc(64, ((kwords * 4 + 63) / 64) * 64);
        uint32_t *wide = widened ? (uint32_t *)aligned_alloc(64, bwords * 4) : NULL;
        float *tiles = (float *)aligned_alloc(64, twords * 4);
        int ok = (a->wpacked || wpack) && (!widened || wide) && tiles;
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        unsigned csr = ggopt_lp_enter_ftz(a);
        for (ptrdiff_t q0 = 0; q0 < (wsteps > 0 ? wsteps : 1); q0 += (kpass > 0 ? kpass : 1)) {
            ptrdiff_t q1 = wsteps - q0 < kpass ? wsteps : q0 + kpass;
            int first = q0 == 0, last = q1 >= wsteps;
            #pragma omp for schedule(static)
            for (ptrdiff_t jp = 0; jp < n_panels; jp++) {
                if (!ok) continue;
                ptrdiff_t j0 = jp * GGOPT_LP_NR;
                int nc = (int)(a->m - j0 < GGOPT_LP_NR ? a->m - j0 : GGOPT_LP_NR);
                const uint32_t *panel = a->wpacked ? a->wpacked + jp * pwords + q0 * GGOPT_LP_NR
                                                   : wpack;
                if (!a->wpacked) ggopt_lp_pack_w(a, j0, q0, q1, wpack);
                if (first) {
                    memset(tiles, 0, twords * 4);
                } else {  /* the partial sums of the previous passes */
                    for (ptrdiff_t i = 0; i < a->n; i++)
                        for (int c = 0; c < nc; c++)
                            tiles[(i / GGOPT_LP_MR) * GGOPT_LP_MR * GGOPT_LP_NR +
                                  (i % GGOPT_LP_MR) * GGOPT_LP_NR + c] =
                                a->c[i * a->c_rs + (j0 + c) * a->c_cs];
                }
                for (ptrdiff_t p0 = q0; p0 < q1; p0 += GGOPT_LP_KC) {
                    ptrdiff_t len = q1 - p0 < GGOPT_LP_KC ? q1 - p0 : GGOPT_LP_KC;
                    const uint32_t *wp = panel + (p0 - q0) * GGOPT_LP_NR;
                    if (widened) {
#if GGOPT_LP_X86
                        if (a->kernel == GGOPT_LP_AVX2) ggopt_lp_widen_w_avx2(wp, len, wide);
                        else ggopt_lp_widen_w_hw(wp, len, wide);
#else
                        ggopt_lp_widen_w(wp, len, wide);
#endif
                        wp = wide;
                    }
                    for (ptrdiff_t ib = 0; ib < n_blocks; ib++)
                        ggopt_lp_tile(a, xpack + ib * xwords + p0 * xper * GGOPT_LP_MR, wp,
                                      len * xper, tiles + ib * GGOPT_LP_MR * GGOPT_LP_NR);
                }
                for (ptrdiff_t i = 0; i < a->n; i++) {
                    float *crow = a->c + i * a->c_rs + j0 * a->c_cs;
                    const float *t = tiles + (i / GGOPT_LP_MR) * GGOPT_LP_MR * GGOPT_LP_NR +
                                     (i % GGOPT_LP_MR) * GGOPT_LP_NR;
                    for (int c = 0; c < nc; c++) {
                        float v = t[c];
                        if (last && widened && v != v) v = ggopt_lp_emulated_output(a, i, j0 + c);
                        crow[c * a->c_cs] = v;
                    }
                }
            }
        }
        ggopt_lp_leave_ftz(a, csr);
        free(wpack);
        free(wide);
        free(tiles);
    }
    free(xpack);
    return failed ? -1 : 0;
}

#endif
