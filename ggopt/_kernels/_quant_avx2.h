/* The integer products of _quant_dot.h on CPUs without AVX-512 VNNI: an AVX2 kernel
   (vpmaddubsw + vpmaddwd) and an AVX-VNNI one (vpdpbusd on 256-bit registers), on the same
   packed groups as the portable and AVX-512 kernels, with the same float operations per output
   in the same order: the same bits. They alone also round a K-quant's block sums in ggml's
   tiled order (ggopt_qdot_group_ggml_*, with fused multiply-adds: docs/ggml-order.md).

   Each call computes up to 4 activation rows x one group of 16 weight rows (two registers of
   8 lanes). The integer sums are exact:
   - unsigned codes (Q2_K <= 3, Q3_K <= 7, Q4_0/Q4_1/Q4_K <= 15, Q5_0/Q5_1/Q5_K <= 31,
     Q6_K <= 63) x signed activations:
     vpmaddubsw's 16-bit pair sums are at most 2 * 128 * top, so S of them (8, 4, 2: at most
     32256; 4 for the 16-element sub-blocks of Q2_K and Q3_K) are added in 16 bits before
     vpmaddwd widens them (times 1, or the K-quant sub-block's scale, which fits 16 bits);
   - Q8_0's signed codes (-128 in a hostile file) would saturate vpmaddubsw: the even and odd
     codes of each lane are sign-extended to 16 bits and multiplied with vpmaddwd against the
     unbiased activations (every pair sum fits 32 bits);
   - AVX-VNNI's vpdpbusd (u8 x s8, four products into 32 bits) is exact as the AVX-512 one:
     the same operands as that kernel (Q8_0: biased activations x signed codes, minus 128 times
     the codes' sums).
   Integer sums are only added, subtracted and multiplied (mod 2^32), so their order does not
   change them. Compiled with per-function target attributes (never -march=native); chosen at
   import by __builtin_cpu_supports. Included by _quant_dot.h after its packed formats. The
   file includes itself twice to instantiate the kernel for each instruction set. */
#ifndef GGOPT_QUANT_AVX2_BODY
#ifndef GGOPT_QUANT_AVX2_H
#define GGOPT_QUANT_AVX2_H

/* the kernels of the rows AMX does not take (ggopt_qdot_panel's kern) */
enum { GGOPT_KERN_PORTABLE = 0, GGOPT_KERN_VNNI = 1, GGOPT_KERN_AVX2 = 2, GGOPT_KERN_AVXVNNI = 3 };

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define GGOPT_HAVE_AVX2 1
#include <immintrin.h>

static inline int ggopt_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
           && __builtin_cpu_supports("f16c");
}

static inline int ggopt_cpu_has_avxvnni(void) {
    return ggopt_cpu_has_avx2() && __builtin_cpu_supports("avxvnni");
}

static inline int32_t ggopt_load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the kernel's code paths (compile-time constants, so that its loops unroll): Q8_0, the
   32-blocks of 4-bit and 5-bit codes, Q4_K, Q5_K (Q4_K's with 5-bit codes), then the K-quants
   of 16-element sub-blocks Q2_K, Q3_K, Q6_K */
enum { GGOPT_XK_Q8 = 0, GGOPT_XK_U4 = 1, GGOPT_XK_U5 = 2, GGOPT_XK_Q4K = 3, GGOPT_XK_Q5K = 4,
       GGOPT_XK_Q2K = 5, GGOPT_XK_Q3K = 6, GGOPT_XK_Q6K = 7 };

static inline int ggopt_avx2_kind(int wtype) {
    switch (wtype) {
    case GGOPT_Q8_0: return GGOPT_XK_Q8;
    case GGOPT_Q4_0: case GGOPT_Q4_1: return GGOPT_XK_U4;
    case GGOPT_Q5_0: case GGOPT_Q5_1: return GGOPT_XK_U5;
    case GGOPT_Q4_K: return GGOPT_XK_Q4K;
    case GGOPT_Q5_K: return GGOPT_XK_Q5K;
    case GGOPT_Q2_K: return GGOPT_XK_Q2K;
    case GGOPT_Q3_K: return GGOPT_XK_Q3K;
    default: return GGOPT_XK_Q6K;
    }
}

/* S: the 16-bit pair sums of a kind's codes (at most 15, 31, 63) that may be added before
   they could overflow (and that divide the 4 steps of a 16-element sub-block) */
#define GGOPT_XK_CHUNK(kind)                                                                 \
    ((kind) == GGOPT_XK_U5 || (kind) == GGOPT_XK_Q5K || (kind) == GGOPT_XK_Q2K             \
             || (kind) == GGOPT_XK_Q3K                                                     \
         ? 4                                                                               \
         : ((kind) == GGOPT_XK_Q6K ? 2 : 8))

/* two values that fit 16 bits as one 32-bit word: lo in the low half, hi in the high half */
static inline int32_t ggopt_pair32(int32_t lo, int32_t hi) {
    return (int32_t)(((uint32_t)lo & 0xffffu) | ((uint32_t)hi << 16));
}

/* keeps GCC from loading every row's activations of a step before the first row's products:
   16 ymm registers hold the 8 running sums, the 2 weight vectors and one row's activations;
   with 4 broadcasts in flight one sum went to the stack, a store and a reload each step (Q4_1
   5-7 % and Q4_K 12 % faster with it, 2026-12-05 on Zen 3) */
#define GGOPT_X_ROW_BARRIER() __asm__ volatile("" ::: "memory")

#define GGOPT_QUANT_AVX2_BODY 1
#define GGOPT_X_TARGET __attribute__((target("avx2,fma")))
#define GGOPT_X(name) name##_avx2
#define GGOPT_X_VNNI 0
#include "_quant_avx2.h"
#undef GGOPT_X_TARGET
#undef GGOPT_X
#undef GGOPT_X_VNNI
#define GGOPT_X_TARGET __attribute__((target("avx2,fma,avxvnni")))
#define GGOPT_X(name) name##_avxvnni
#define GGOPT_X_VNNI 1
#include "_quant_avx2.h"
#undef GGOPT_X_TARGET
#undef GGOPT_X
#undef GGOPT_X_VNNI
#undef GGOPT_QUANT_AVX2_BODY

/* One panel (ggopt_qdot_panel's arguments) when kern is an AVX2 kernel: each group against
   all N activation rows, 4 at a time (the group's codes stay in the L1 cache); 0 (nothing
   done) for the other kernels */
static inline int ggopt_qdot_panel_avx2(int kern, int wtype, const uint8_t *g0, const uint8_t *g1,
                                        int ml, const ggopt_q8_rows *x, Py_ssize_t N, float *out,
                                        Py_ssize_t ldo) {
    if (kern != GGOPT_KERN_AVX2 && kern != GGOPT_KERN_AVXVNNI) return 0;
    void (*group)(int, const uint8_t *, const ggopt_q8_rows *, Py_ssize_t, int, int, float *,
                  Py_ssize_t) =
        kern == GGOPT_KERN_AVXVNNI
            ? (x->ggml_tiled ? ggopt_qdot_group_ggml_avxvnni : ggopt_qdot_group_avxvnni)
            : (x->ggml_tiled ? ggopt_qdot_group_ggml_avx2 : ggopt_qdot_group_avx2);
    for (int g = 0; g < 2 && 16 * g < ml; g++) {
        int nl = ml - 16 * g < 16 ? ml - 16 * g : 16;
        for (Py_ssize_t n0 = 0; n0 < N; n0 += 4)
            group(wtype, g ? g1 : g0, x, n0, N - n0 < 4 ? (int)(N - n0) : 4, nl,
                  out + n0 * ldo + 16 * g, ldo);
    }
    return 1;
}
#else
#define GGOPT_HAVE_AVX2 0
static inline int ggopt_cpu_has_avx2(void) { return 0; }
static inline int ggopt_cpu_has_avxvnni(void) { return 0; }
static inline int ggopt_qdot_panel_avx2(int kern, int wtype, const uint8_t *g0, const uint8_t *g1,
                                        int ml, const ggopt_q8_rows *x, Py_ssize_t N, float *out,
                                        Py_ssize_t ldo) {
    (void)kern; (void)wtype; (void)g0; (void)g1; (void)ml; (void)x; (void)N; (void)out;
    (void)ldo;
    return 0;
}
#endif
#endif

#else
/* ---------------------------------------------------------------- one instantiation */

/* acc[r][h] += sum over `steps` 4-code steps of the unsigned codes c (64 bytes a step: lanes
   8h..8h+7 in register h) x the signed activations a[r] (4 a step), times mul[h] (per-lane
   int32, the sub-block's scale) unless mul is NULL. S: steps per 16-bit sum (AVX2). */
GGOPT_X_TARGET static inline __attribute__((always_inline)) void GGOPT_X(ggopt_xdot_u)(
        const uint8_t *c, const int8_t *const *a, const int nr, const int steps, const int S,
        const __m256i *mul, __m256i acc[4][2]) {
#if GGOPT_X_VNNI
    (void)S;
    __m256i dp[4][2];
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < 2; h++) dp[r][h] = mul ? _mm256_setzero_si256() : acc[r][h];
#pragma GCC unroll 8
    for (int k = 0; k < steps; k++) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(c + 64 * k));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32));
        for (int r = 0; r < nr; r++) {
            __m256i xa = _mm256_set1_epi32(ggopt_load_i32(a[r] + 4 * k));
            dp[r][0] = _mm256_dpbusd_avx_epi32(dp[r][0], w0, xa);
            dp[r][1] = _mm256_dpbusd_avx_epi32(dp[r][1], w1, xa);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < 2; h++)
            acc[r][h] = mul ? _mm256_add_epi32(acc[r][h], _mm256_mullo_epi32(dp[r][h], mul[h]))
                            : dp[r][h];
#else
    __m256i m16[2];
    for (int h = 0; h < 2; h++)  /* the multiplier in both 16-bit halves of each lane */
        m16[h] = mul ? _mm256_blend_epi16(mul[h], _mm256_slli_epi32(mul[h], 16), 0xAA)
                     : _mm256_set1_epi16(1);
    for (int k0 = 0; k0 < steps; k0 += S) {
        __m256i s16[4][2];
        for (int r = 0; r < nr; r++) s16[r][0] = s16[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int k = k0; k < k0 + S; k++) {
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(c + 64 * k));
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32));
            for (int r = 0; r < nr; r++) {
                __m256i xa = _mm256_set1_epi32(ggopt_load_i32(a[r] + 4 * k));
                s16[r][0] = _mm256_add_epi16(s16[r][0], _mm256_maddubs_epi16(w0, xa));
                s16[r][1] = _mm256_add_epi16(s16[r][1], _mm256_maddubs_epi16(w1, xa));
                GGOPT_X_ROW_BARRIER();
            }
        }
        for (int r = 0; r < nr; r++)
            for (int h = 0; h < 2; h++)
                acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(s16[r][h], m16[h]));
    }
#endif
}

/* per lane l of 8: lo[l] in the low 16 bits, hi[l] in the high 16 (both fit 16 bits) */
GGOPT_X_TARGET static inline __attribute__((always_inline)) __m256i GGOPT_X(ggopt_pair16)(
        const int32_t *lo, const int32_t *hi) {
    return _mm256_blend_epi16(_mm256_loadu_si256((const __m256i *)lo),
                              _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)hi), 16),
                              0xAA);
}

/* Q8_0, one block: acc[r][h] = the sum of the signed codes x the activations a[r] (stored
   biased by 128). AVX-VNNI: biased x codes (the caller takes 128 * the codes' sums off);
   AVX2: the even and odd codes of each lane sign-extended to 16 bits (vpmaddwd) against the
   unbiased activations' pairs (0, 2) and (1, 3) of each step. */
GGOPT_X_TARGET static inline __attribute__((always_inline)) void GGOPT_X(ggopt_xdot_q8)(
        const uint8_t *c, const int8_t *const *a, const int nr, __m256i acc[4][2]) {
#if GGOPT_X_VNNI
    for (int k = 0; k < 8; k++) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(c + 64 * k));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32));
        for (int r = 0; r < nr; r++) {
            __m256i xa = _mm256_set1_epi32(ggopt_load_i32(a[r] + 4 * k));
            acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], xa, w0);
            acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], xa, w1);
        }
    }
#else
    int32_t ae[4][8], ao[4][8];
    for (int r = 0; r < nr; r++) {
        __m256i s = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)a[r]),
                                     _mm256_set1_epi8((char)0x80));
        _mm256_storeu_si256((__m256i *)ae[r], _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8));
        _mm256_storeu_si256((__m256i *)ao[r], _mm256_srai_epi16(s, 8));
    }
    __m256i s[4][2];  /* local running sums (registers, not the caller's array) */
    for (int r = 0; r < nr; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int k = 0; k < 8; k++) {
        __m256i we[2], wo[2];
        for (int h = 0; h < 2; h++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32 * h));
            we[h] = _mm256_srai_epi16(_mm256_slli_epi16(w, 8), 8);
            wo[h] = _mm256_srai_epi16(w, 8);
        }
        for (int r = 0; r < nr; r++) {
            __m256i xe = _mm256_set1_epi32(ae[r][k]), xo = _mm256_set1_epi32(ao[r][k]);
            for (int h = 0; h < 2; h++)
                s[r][h] = _mm256_add_epi32(s[r][h], _mm256_add_epi32(
                    _mm256_madd_epi16(we[h], xe), _mm256_madd_epi16(wo[h], xo)));
            GGOPT_X_ROW_BARRIER();
        }
    }
    for (int r = 0; r < nr; r++) acc[r][0] = s[r][0], acc[r][1] = s[r][1];
#endif
}

/* out[r*ldo + lane] for rows n0..n0+nr-1 of x and the lanes < nl of one group: each output
   the portable kernel's integers and float operations in the same order (a K-quant with
   ggml_tiled: the same integers in ggml's tiled order, which only these kernels take) */
GGOPT_X_TARGET static inline __attribute__((always_inline)) void GGOPT_X(ggopt_qdot_group_nr)(
        int wtype, const int kind, const int ggml_tiled, const uint8_t *grp,
        const ggopt_q8_rows *x, Py_ssize_t n0, const int nr, int nl, float *out, Py_ssize_t ldo) {
    Py_ssize_t pbb = ggopt_packed_block_bytes(wtype), nb = x->nb, K = x->K;
    const int kq = kind >= GGOPT_XK_Q4K, q8 = kind == GGOPT_XK_Q8;
    const int q4k = kind == GGOPT_XK_Q4K || kind == GGOPT_XK_Q5K;  /* 32-element sub-blocks */
    const int q2k = kind == GGOPT_XK_Q2K;  /* 16-element ones with minimums */
    const int S = GGOPT_XK_CHUNK(kind);
    int32_t off = ggopt_code_offset(wtype);
    Py_ssize_t ncode = kq ? GGOPT_QK_K * GGOPT_LANES : GGOPT_QK * GGOPT_LANES;
    __m256 acc[4][2];
    const int8_t *xq[4], *a[4];
    for (int r = 0; r < nr; r++) {
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        xq[r] = x->q + (n0 + r) * K;
    }
    for (Py_ssize_t b = 0; b < nb; b++) {
        const uint8_t *c = grp + b * pbb;
        __m256i is[4][2];
        for (int r = 0; r < nr; r++) is[r][0] = is[r][1] = _mm256_setzero_si256();
        if (!kq) {
            const ggopt_meta32 *m = (const ggopt_meta32 *)(c + ncode);
            for (int r = 0; r < nr; r++) a[r] = xq[r] + b * GGOPT_QK;
            if (q8) GGOPT_X(ggopt_xdot_q8)(c, a, nr, is);
            else GGOPT_X(ggopt_xdot_u)(c, a, nr, 8, S, NULL, is);
            for (int r = 0; r < nr; r++) {
                Py_ssize_t n = n0 + r;
                __m256 da = _mm256_set1_ps(x->d[n * nb + b]);
                const int32_t *bs = x->sums + n * (K / 16) + 2 * b;
                int32_t asum = off ? bs[0] + bs[1] : 0;
                for (int h = 0; h < 2; h++) {
                    __m256i isum = is[r][h];
#if GGOPT_X_VNNI
                    if (q8)
                        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(
                            _mm256_loadu_si256((const __m256i *)(m->wsum + 8 * h)), 7));
#endif
                    if (!q8 && off)  /* Q4_0 / Q5_0: the codes' offset */
                        isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * asum));
                    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(m->d + 8 * h), da);
                    acc[r][h] = _mm256_add_ps(acc[r][h], _mm256_mul_ps(t, _mm256_cvtepi32_ps(isum)));
                    if (x->s)
                        acc[r][h] = _mm256_add_ps(acc[r][h], _mm256_mul_ps(
                            _mm256_loadu_ps(m->m + 8 * h), _mm256_set1_ps(x->s[n * nb + b])));
                }
            }
            continue;
        }
        const ggopt_metak *m = (const ggopt_metak *)(c + ncode);
        if (q4k) {
            for (int j = 0; j < 8; j++) {
                __m256i sc[2] = {_mm256_loadu_si256((const __m256i *)m->sc[j]),
                                 _mm256_loadu_si256((const __m256i *)(m->sc[j] + 8))};
                for (int r = 0; r < nr; r++) a[r] = xq[r] + b * GGOPT_QK_K + 32 * j;
                GGOPT_X(ggopt_xdot_u)(c + 64 * 8 * j, a, nr, 8, S, sc, is);
            }
        } else {  /* Q2_K, Q3_K, Q6_K: sum_j sc_j * (dp_j - off * bsum_j) */
            for (int j = 0; j < 16; j++) {
                __m256i sc[2] = {_mm256_loadu_si256((const __m256i *)m->sc[j]),
                                 _mm256_loadu_si256((const __m256i *)(m->sc[j] + 8))};
                for (int r = 0; r < nr; r++) a[r] = xq[r] + b * GGOPT_QK_K + 16 * j;
                GGOPT_X(ggopt_xdot_u)(c + 64 * 4 * j, a, nr, 4, S, sc, is);
            }
            /* off * sum_j sc_j * bsum_j by pairs of j (|sc| <= 128, |bsum| <= 2032: 16 bits);
               off = 32 (Q6_K) or 4 (Q3_K) as a shift */
            for (int h = 0; h < 2 && !q2k; h++) {
                __m256i sp[8];
                for (int k = 0; k < 8; k++)
                    sp[k] = GGOPT_X(ggopt_pair16)(m->sc[2 * k] + 8 * h, m->sc[2 * k + 1] + 8 * h);
                for (int r = 0; r < nr; r++) {
                    const int32_t *bs = x->sums + (n0 + r) * (K / 16) + b * 16;
                    __m256i corr = _mm256_setzero_si256();
                    for (int k = 0; k < 8; k++)
                        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(
                            sp[k], _mm256_set1_epi32(ggopt_pair32(bs[2 * k], bs[2 * k + 1]))));
                    is[r][h] = _mm256_sub_epi32(is[r][h], _mm256_slli_epi32(
                        corr, kind == GGOPT_XK_Q6K ? 5 : 2));
                }
            }
        }
        /* the minimums by pairs of sub-blocks: Q4_K/Q5_K's 8 (of 32), Q2_K's 16 (of 16) */
        const int np = q4k ? 4 : (q2k ? 8 : 0);
        __m256i mp[2][8];
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < np; k++)
                mp[h][k] = GGOPT_X(ggopt_pair16)(m->mn[2 * k] + 8 * h, m->mn[2 * k + 1] + 8 * h);
        for (int r = 0; r < nr; r++) {
            Py_ssize_t n = n0 + r;
            const int32_t *bs = x->sums + n * (K / 16) + b * 16;
            __m256 da = _mm256_set1_ps(x->d[n * nb + b]);
            __m256i bp[8];  /* the activations' sub-block sums (|sum| <= 4064), by pairs */
            for (int k = 0; k < np; k++)
                bp[k] = _mm256_set1_epi32(
                    q4k ? ggopt_pair32(bs[4 * k] + bs[4 * k + 1], bs[4 * k + 2] + bs[4 * k + 3])
                        : ggopt_pair32(bs[2 * k], bs[2 * k + 1]));
            for (int h = 0; h < 2; h++) {
                __m256i msum = _mm256_setzero_si256();
                for (int k = 0; k < np; k++)
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mp[h][k], bp[k]));
                if (ggml_tiled) {  /* r = d_w S1, r = fma(-dmin_w, S2, r), acc = fma(r, d_y, acc) */
                    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(m->d + 8 * h),
                                             _mm256_cvtepi32_ps(is[r][h]));
                    if (np)
                        t = _mm256_fnmadd_ps(_mm256_loadu_ps(m->m + 8 * h),
                                             _mm256_cvtepi32_ps(msum), t);
                    acc[r][h] = _mm256_fmadd_ps(t, da, acc[r][h]);
                    continue;
                }
                __m256 t = _mm256_mul_ps(_mm256_loadu_ps(m->d + 8 * h), da);
                acc[r][h] = _mm256_add_ps(acc[r][h], _mm256_mul_ps(t, _mm256_cvtepi32_ps(is[r][h])));
                if (np) {
                    __m256 tm = _mm256_mul_ps(_mm256_loadu_ps(m->m + 8 * h), da);
                    acc[r][h] = _mm256_sub_ps(acc[r][h], _mm256_mul_ps(tm, _mm256_cvtepi32_ps(msum)));
                }
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        float row[GGOPT_LANES];
        _mm256_storeu_ps(row, acc[r][0]);
        _mm256_storeu_ps(row + 8, acc[r][1]);
        memcpy(out + r * ldo, row, (size_t)nl * sizeof(float));
    }
}

GGOPT_X_TARGET static inline __attribute__((always_inline)) void GGOPT_X(ggopt_qdot_group_kind)(
        int wtype, const int kind, const int ggml_tiled, const uint8_t *grp,
        const ggopt_q8_rows *x, Py_ssize_t n0, int nr, int nl, float *out, Py_ssize_t ldo) {
    switch (nr) {
#define GGOPT_X_NR(R) \
    case R: GGOPT_X(ggopt_qdot_group_nr)(wtype, kind, ggml_tiled, grp, x, n0, R, nl, out, ldo); break;
    GGOPT_X_NR(4) GGOPT_X_NR(3) GGOPT_X_NR(2)
#undef GGOPT_X_NR
    default: GGOPT_X(ggopt_qdot_group_nr)(wtype, kind, ggml_tiled, grp, x, n0, 1, nl, out, ldo);
    }
}

GGOPT_X_TARGET static void GGOPT_X(ggopt_qdot_group)(int wtype, const uint8_t *grp,
                                                     const ggopt_q8_rows *x, Py_ssize_t n0,
                                                     int nr, int nl, float *out, Py_ssize_t ldo) {
    switch (ggopt_avx2_kind(wtype)) {
#define GGOPT_X_KIND(K) \
    case K: GGOPT_X(ggopt_qdot_group_kind)(wtype, K, 0, grp, x, n0, nr, nl, out, ldo); break;
    GGOPT_X_KIND(GGOPT_XK_Q8) GGOPT_X_KIND(GGOPT_XK_U4) GGOPT_X_KIND(GGOPT_XK_U5)
    GGOPT_X_KIND(GGOPT_XK_Q4K) GGOPT_X_KIND(GGOPT_XK_Q5K) GGOPT_X_KIND(GGOPT_XK_Q2K)
    GGOPT_X_KIND(GGOPT_XK_Q3K)
#undef GGOPT_X_KIND
    default: GGOPT_X(ggopt_qdot_group_kind)(wtype, GGOPT_XK_Q6K, 0, grp, x, n0, nr, nl, out, ldo);
    }
}

/* the K-quants' groups with their block sums rounded in ggml's tiled order (x->ggml_tiled):
   the only fused multiply-adds of this module */
GGOPT_X_TARGET static void GGOPT_X(ggopt_qdot_group_ggml)(int wtype, const uint8_t *grp,
                                                          const ggopt_q8_rows *x, Py_ssize_t n0,
                                                          int nr, int nl, float *out,
                                                          Py_ssize_t ldo) {
    switch (ggopt_avx2_kind(wtype)) {
#define GGOPT_X_KIND(K) \
    case K: GGOPT_X(ggopt_qdot_group_kind)(wtype, K, 1, grp, x, n0, nr, nl, out, ldo); break;
    GGOPT_X_KIND(GGOPT_XK_Q4K) GGOPT_X_KIND(GGOPT_XK_Q5K) GGOPT_X_KIND(GGOPT_XK_Q2K)
    GGOPT_X_KIND(GGOPT_XK_Q3K) GGOPT_X_KIND(GGOPT_XK_Q6K)
#undef GGOPT_X_KIND
    default: break;  /* mul_mat_q8 takes ggml's order for the K-quants only */
    }
}
#endif
