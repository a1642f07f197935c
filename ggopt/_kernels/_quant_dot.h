/* ggml's integer products of a quantized weight (its mul_mat on the CPU backend): the
   activations are rounded to the weight type's vec_dot_type (Q4_0, Q5_0, Q8_0 -> Q8_0;
   Q4_1, Q5_1 -> Q8_1; Q2_K ... Q6_K -> Q8_K) as ggml's x86 quantize_row_q8_* computes them,
   then each block's integer sum is scaled and the blocks are added in order.

   Activations (ggopt_q8_rows): per row the int8 codes (biased to u8 by 128 for a Q8_0
   weight), one float scale per block (Q8_0/Q8_1: the F16 d's value; Q8_K: its F32 d), Q8_1's
   s (its F16 value) and the integer sum of every 16 codes (Q8_K's bsums; the 32-blocks' sums
   for their offsets).
   Weights are packed per 16 rows ("a group"; lane j = row j): per block, the codes as
   [k/4][lane][4 bytes] (unsigned 0..63, or signed for Q8_0) and the block's scales per lane.
   Every output is one running float sum over the blocks in order, the block's terms computed
   as  acc = acc + (dw * da) * (float)isum  [ + mw * s | - (dmin * da) * (float)msum ],
   each product and sum rounded once (no FMA: setup.py), so the AVX-512 VNNI kernel and the
   portable one give the same bits; the integer sums are exact in both. */
#ifndef GGOPT_QUANT_DOT_H
#define GGOPT_QUANT_DOT_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "_quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define GGOPT_HAVE_VNNI 1
#include <immintrin.h>
#define GGOPT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#else
#define GGOPT_HAVE_VNNI 0
#endif

enum { GGOPT_VD_Q8_0 = 8, GGOPT_VD_Q8_1 = 9, GGOPT_VD_Q8_K = 15 };
#define GGOPT_LANES 16

/* the vec_dot_type of a weight type, 0 when it has no integer product here */
static inline int ggopt_vec_dot_type(int wtype) {
    switch (wtype) {
    case GGOPT_Q4_0: case GGOPT_Q5_0: case GGOPT_Q8_0: return GGOPT_VD_Q8_0;
    case GGOPT_Q4_1: case GGOPT_Q5_1: return GGOPT_VD_Q8_1;
    case GGOPT_Q2_K: case GGOPT_Q3_K: case GGOPT_Q4_K: case GGOPT_Q5_K: case GGOPT_Q6_K:
        return GGOPT_VD_Q8_K;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- activations */

/* _mm_max_ps(a, b): a when a > b, else b (so b when either is NaN) */
static inline float ggopt_maxps(float a, float b) { return a > b ? a : b; }

/* cvtps_epi32 of an already rounded value: INT32_MIN for NaN or out of range */
static inline int32_t ggopt_cvt_i32(float r) {
    return (r >= -2147483648.0f && r < 2147483648.0f) ? (int32_t)r : INT32_MIN;
}

/* One block of 32 as ggml's AVX quantize_row_q8_0 / q8_1: max|x| by its lane tree, d =
   amax/127 stored as F16, codes = round-to-nearest-even(x * (127/amax)) saturated to int8;
   *s = F16(d * sum of the unsaturated ints) (Q8_1). Writes codes (biased by 128 when bias). */
static inline void ggopt_q8_block32(const float *x, int8_t *q, float *d_out, float *s_out,
                                    int bias) {
    float m[8], m4[4];
    for (int l = 0; l < 8; l++) {
        m[l] = fabsf(x[l]);
        m[l] = ggopt_maxps(m[l], fabsf(x[8 + l]));
        m[l] = ggopt_maxps(m[l], fabsf(x[16 + l]));
        m[l] = ggopt_maxps(m[l], fabsf(x[24 + l]));
    }
    for (int l = 0; l < 4; l++) m4[l] = ggopt_maxps(m[4 + l], m[l]);
    m4[0] = ggopt_maxps(m4[0], m4[2]);
    m4[1] = ggopt_maxps(m4[1], m4[3]);
    float amax = ggopt_maxps(m4[0], m4[1]);
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    uint32_t sum = 0;
    for (int j = 0; j < GGOPT_QK; j++) {
        int32_t i = ggopt_cvt_i32(nearbyintf(x[j] * id));
        sum += (uint32_t)i;
        int v = i < -128 ? -128 : (i > 127 ? 127 : i);
        q[j] = (int8_t)(bias ? (int8_t)(uint8_t)(v + 128) : v);
    }
    *d_out = ggopt_f16_to_f32(ggopt_f32_to_f16(d));
    if (s_out) *s_out = ggopt_f16_to_f32(ggopt_f32_to_f16(d * (float)(int32_t)sum));
}

/* ggml's nearest_int: round to nearest even by the 1.5 * 2^23 trick (NaN -> its payload) */
static inline int ggopt_nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* One super-block of 256 as ggml's quantize_row_q8_K (x86 runs the reference): the element
   of largest magnitude (the first; NaN never counts) maps to -127, d = 1/iscale in F32 */
static inline void ggopt_q8_block256(const float *x, int8_t *q, float *d_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < GGOPT_QK_K; j++) {
        float ax = fabsf(x[j]);
        if (ax > amax) { amax = ax; max = x[j]; }
    }
    if (amax == 0.0f) {
        memset(q, 0, GGOPT_QK_K);
        *d_out = 0.0f;
        return;
    }
    float iscale = -127.0f / max;
    for (int j = 0; j < GGOPT_QK_K; j++) {
        int v = ggopt_nearest_int(iscale * x[j]);
        q[j] = (int8_t)(v < 127 ? v : 127);
    }
    *d_out = 1.0f / iscale;
}

/* the sums of each 16 codes (unbiased) */
static inline void ggopt_q8_sums16(const int8_t *q, Py_ssize_t K, int bias, int32_t *sums) {
    for (Py_ssize_t i = 0; i < K / 16; i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++) s += bias ? (int32_t)(uint8_t)q[16 * i + j] - 128
                                               : (int32_t)q[16 * i + j];
        sums[i] = s;
    }
}

#if GGOPT_HAVE_VNNI
/* max|x| of a 32-element block by ggml's AVX lane tree (max_ps keeps its second operand on
   NaN, like ggopt_maxps); inlined into the AVX2 and AVX-512 roundings */
__attribute__((target("avx"))) static inline float ggopt_q8_amax32_avx(const float *xb) {
    const __m256 s8 = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(s8, _mm256_loadu_ps(xb));
    m = _mm256_max_ps(m, _mm256_andnot_ps(s8, _mm256_loadu_ps(xb + 8)));
    m = _mm256_max_ps(m, _mm256_andnot_ps(s8, _mm256_loadu_ps(xb + 16)));
    m = _mm256_max_ps(m, _mm256_andnot_ps(s8, _mm256_loadu_ps(xb + 24)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

/* ggopt_q8_sums16 with AVX-512: psadbw sums each 8 codes as unsigned bytes (the signed codes
   offset by 128 first unless stored so), so a 16-sum is two of them minus 16 * 128 (exact) */
GGOPT_VNNI static void ggopt_q8_sums16_avx512(const int8_t *q, Py_ssize_t K, int bias,
                                              int32_t *sums) {
    const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    /* dwords 0, 4, 8, 12 of two registers: the low halves of their 128-bit lanes' qword 0 */
    const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    Py_ssize_t i = 0;
    for (; i + 128 <= K; i += 128) {
        __m512i t[2];
        for (int h = 0; h < 2; h++) {
            __m512i u = _mm512_loadu_si512((const void *)(q + i + 64 * h));
            if (!bias) u = _mm512_xor_si512(u, flip);
            __m512i s = _mm512_sad_epu8(u, zero);
            t[h] = _mm512_add_epi64(s, _mm512_bsrli_epi128(s, 8));
        }
        __m512i r = _mm512_sub_epi32(_mm512_permutex2var_epi32(t[0], pick, t[1]),
                                     _mm512_set1_epi32(16 * 128));
        _mm256_storeu_si256((__m256i *)(sums + i / 16), _mm512_castsi512_si256(r));
    }
    ggopt_q8_sums16(q + i, K - i, bias, sums + i / 16);
}

/* ggopt_q8_block32 (and ggopt_q8_sums16) with AVX-512 on a row, 16 blocks at a time: each
   block's max|x| by ggml's lane tree (max_ps keeps its second operand on NaN like
   ggopt_maxps), then the 16 blocks' d = amax / 127 and 127 / amax by vector divisions (IEEE,
   as the scalar ones), the codes converted rounding to nearest even (nearbyintf; NaN and out
   of range give cvtps_epi32's INT32_MIN) and saturated to int8; Q8_1's s from the 16-sums
   unless a block saturated (then from its unsaturated ints, wrapping): the same bits */
GGOPT_VNNI static void ggopt_q8_row32_avx512(int vtype, const float *x, Py_ssize_t K, int bias,
                                             int8_t *q, float *d, float *s, int32_t *sums) {
    Py_ssize_t nb = K / GGOPT_QK;
    float amax[16] __attribute__((aligned(64))), inv[16] __attribute__((aligned(64)));
    int32_t unsat[16];
    for (Py_ssize_t b0 = 0; b0 < nb; b0 += 16) {
        int n = nb - b0 < 16 ? (int)(nb - b0) : 16;
        for (int j = 0; j < n; j++) {
            amax[j] = ggopt_q8_amax32_avx(x + (b0 + j) * GGOPT_QK);
        }
        __mmask16 k = (__mmask16)((1u << n) - 1);
        __m512 va = _mm512_maskz_load_ps(k, amax), c127 = _mm512_set1_ps(127.0f);
        _mm512_mask_storeu_ps(d + b0, k, _mm512_div_ps(va, c127));
        __mmask16 nz = _mm512_cmp_ps_mask(va, _mm512_setzero_ps(), _CMP_NEQ_UQ);  /* NaN too */
        _mm512_store_ps(inv, _mm512_maskz_div_ps(nz, c127, va));
        uint16_t sat = 0;  /* the blocks whose ints were saturated (Q8_1) */
        for (int j = 0; j < n; j++) {
            const float *xb = x + (b0 + j) * GGOPT_QK;
            int8_t *qb = q + (b0 + j) * GGOPT_QK;
            __m512 vid = _mm512_set1_ps(inv[j]);
            /* converted rounding to nearest even: nearbyintf then the exact conversion */
            __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb), vid),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), vid),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m128i c0 = _mm512_cvtsepi32_epi8(i0), c1 = _mm512_cvtsepi32_epi8(i1);
            if (vtype == GGOPT_VD_Q8_1) {
                const __m512i off = _mm512_set1_epi32(128), top = _mm512_set1_epi32(255);
                if (_mm512_cmpgt_epu32_mask(_mm512_add_epi32(i0, off), top)
                    | _mm512_cmpgt_epu32_mask(_mm512_add_epi32(i1, off), top)) {
                    sat |= (uint16_t)(1u << j);
                    unsat[j] = (int32_t)(uint32_t)_mm512_reduce_add_epi32(
                        _mm512_add_epi32(i0, i1));
                }
            }
            if (bias) {
                c0 = _mm_xor_si128(c0, _mm_set1_epi8((char)0x80));
                c1 = _mm_xor_si128(c1, _mm_set1_epi8((char)0x80));
            }
            _mm_storeu_si128((__m128i *)qb, c0);
            _mm_storeu_si128((__m128i *)(qb + 16), c1);
        }
        ggopt_q8_sums16_avx512(q + b0 * GGOPT_QK, (Py_ssize_t)n * GGOPT_QK, bias, sums + 2 * b0);
        if (vtype == GGOPT_VD_Q8_1) {  /* s = d * sum, d still F32 here */
            for (int j = 0; j < n; j++)
                s[b0 + j] = d[b0 + j] * (float)((sat >> j) & 1
                                                    ? unsat[j]
                                                    : sums[2 * (b0 + j)] + sums[2 * (b0 + j) + 1]);
        }
    }
    /* the scales through F16 (round to nearest even; NaN quieted keeping its payload's top
       bits, as ggopt_f32_to_f16) */
    for (Py_ssize_t b = 0; b < nb; b += 16) {
        __mmask16 k = nb - b >= 16 ? 0xffff : (__mmask16)((1u << (nb - b)) - 1);
        for (int t = 0; t < (vtype == GGOPT_VD_Q8_1 ? 2 : 1); t++) {
            float *p = t ? s + b : d + b;
            __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, p),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm512_mask_storeu_ps(p, k, _mm512_cvtph_ps(h));
        }
    }
}

/* ggopt_q8_block256 (and ggopt_q8_sums16) with AVX-512: the same operations on each element
   (Q8_K's magic-number rounding and truncation to int8), the same bits */
GGOPT_VNNI static void ggopt_q8_rowk_avx512(const float *x, Py_ssize_t K, int8_t *q, float *d,
                                            int32_t *sums) {
    for (Py_ssize_t b = 0; b < K / GGOPT_QK_K; b++) {
        const float *xb = x + b * GGOPT_QK_K;
        int8_t *qb = q + b * GGOPT_QK_K;
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < GGOPT_QK_K; k += 16)  /* NaN never wins (second operand) */
            m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + k)), m);
        float amax = _mm512_reduce_max_ps(m), max = 0.0f;
        if (amax == 0.0f) {
            memset(qb, 0, GGOPT_QK_K);
            d[b] = 0.0f;
            continue;
        }
        __m512 va = _mm512_set1_ps(amax);
        for (int k = 0; k < GGOPT_QK_K; k += 16) {  /* the first of largest magnitude */
            __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + k)), va,
                                               _CMP_EQ_OQ);
            if (hit) { max = xb[k + __builtin_ctz(hit)]; break; }
        }
        float iscale = -127.0f / max;
        __m512 vs = _mm512_set1_ps(iscale), magic = _mm512_set1_ps(12582912.0f);
        for (int k = 0; k < GGOPT_QK_K; k += 16) {
            __m512i i = _mm512_castps_si512(_mm512_add_ps(
                _mm512_mul_ps(vs, _mm512_loadu_ps(xb + k)), magic));
            i = _mm512_sub_epi32(_mm512_and_si512(i, _mm512_set1_epi32(0x007fffff)),
                                 _mm512_set1_epi32(0x00400000));
            i = _mm512_min_epi32(i, _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(qb + k), _mm512_cvtepi32_epi8(i));
        }
        d[b] = 1.0f / iscale;
    }
    ggopt_q8_sums16_avx512(q, K, 0, sums);
}
#endif

#if GGOPT_HAVE_VNNI
#define GGOPT_AVX2_ROUND __attribute__((target("avx2,fma,f16c")))
/* F16(v) as F32, round to nearest even; NaN quieted keeping its payload's top bits (vcvtps2ph,
   as ggopt_f32_to_f16) */
GGOPT_AVX2_ROUND static inline float ggopt_f16_round_f16c(float v) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(v),
                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}

/* ggopt_q8_block32 and ggopt_q8_sums16 with AVX2 on a row, block after block: the max by
   ggml's lane tree, the codes rounded to nearest even (roundps) and converted (cvtps_epi32:
   NaN and out of range give INT32_MIN), saturated to int8 by two signed packs (whose 128-bit
   lanes a permute puts back in order), Q8_1's s from the sum of the unsaturated ints
   (wrapping), the 16-sums by psadbw on the codes offset by 128: the same bits */
GGOPT_AVX2_ROUND static void ggopt_q8_row32_avx2(int vtype, const float *x, Py_ssize_t K,
                                                 int bias, int8_t *q, float *d, float *s,
                                                 int32_t *sums) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (Py_ssize_t b = 0; b < K / GGOPT_QK; b++) {
        const float *xb = x + b * GGOPT_QK;
        float amax = ggopt_q8_amax32_avx(xb);
        float db = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i[4];
        for (int h = 0; h < 4; h++)
            i[h] = _mm256_cvtps_epi32(_mm256_round_ps(
                _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * h), vid),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i c = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3])),
            order);
        __m256i u = _mm256_xor_si256(c, flip);  /* the codes plus 128, as unsigned bytes */
        _mm256_storeu_si256((__m256i *)(q + b * GGOPT_QK), bias ? u : c);
        __m256i t = _mm256_sad_epu8(u, _mm256_setzero_si256());
        t = _mm256_add_epi64(t, _mm256_srli_si256(t, 8));
        sums[2 * b] = _mm256_cvtsi256_si32(t) - 16 * 128;
        sums[2 * b + 1] = _mm256_extract_epi32(t, 4) - 16 * 128;
        d[b] = ggopt_f16_round_f16c(db);
        if (vtype == GGOPT_VD_Q8_1) {
            __m256i v = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]),
                                         _mm256_add_epi32(i[2], i[3]));
            __m128i w = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            w = _mm_add_epi32(w, _mm_shuffle_epi32(w, 0x4e));
            w = _mm_add_epi32(w, _mm_shuffle_epi32(w, 0xb1));
            s[b] = ggopt_f16_round_f16c(db * (float)_mm_cvtsi128_si32(w));
        }
    }
}

/* ggopt_q8_block256 and ggopt_q8_sums16 with AVX2: the same operations on each element (the
   max with NaN never winning, the first element of largest magnitude, Q8_K's magic-number
   rounding, the codes' low bytes), the same bits */
GGOPT_AVX2_ROUND static void ggopt_q8_rowk_avx2(const float *x, Py_ssize_t K, int8_t *q,
                                                float *d, int32_t *sums) {
    const __m256 s8 = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i low = _mm256_set1_epi32(0xff), flip = _mm256_set1_epi8((char)0x80);
    for (Py_ssize_t b = 0; b < K / GGOPT_QK_K; b++) {
        const float *xb = x + b * GGOPT_QK_K;
        int8_t *qb = q + b * GGOPT_QK_K;
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < GGOPT_QK_K; k += 8)  /* NaN never wins (second operand) */
            m = _mm256_max_ps(_mm256_andnot_ps(s8, _mm256_loadu_ps(xb + k)), m);
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))), max = 0.0f;
        if (amax == 0.0f) {
            memset(qb, 0, GGOPT_QK_K);
            d[b] = 0.0f;
            for (int j = 0; j < 16; j++) sums[16 * b + j] = 0;
            continue;
        }
        __m256 va = _mm256_set1_ps(amax);
        for (int k = 0; k < GGOPT_QK_K; k += 8) {  /* the first of largest magnitude */
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(
                _mm256_andnot_ps(s8, _mm256_loadu_ps(xb + k)), va, _CMP_EQ_OQ));
            if (hit) { max = xb[k + __builtin_ctz((unsigned)hit)]; break; }
        }
        float iscale = -127.0f / max;
        __m256 vs = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
        for (int k = 0; k < GGOPT_QK_K; k += 32) {
            __m256i i[4];
            for (int h = 0; h < 4; h++) {
                __m256i v = _mm256_castps_si256(_mm256_add_ps(
                    _mm256_mul_ps(vs, _mm256_loadu_ps(xb + k + 8 * h)), magic));
                v = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x007fffff)),
                                     _mm256_set1_epi32(0x00400000));
                i[h] = _mm256_and_si256(_mm256_min_epi32(v, _mm256_set1_epi32(127)), low);
            }
            __m256i c = _mm256_permutevar8x32_epi32(
                _mm256_packus_epi16(_mm256_packus_epi32(i[0], i[1]),
                                    _mm256_packus_epi32(i[2], i[3])), order);
            _mm256_storeu_si256((__m256i *)(qb + k), c);
            __m256i t = _mm256_sad_epu8(_mm256_xor_si256(c, flip), _mm256_setzero_si256());
            t = _mm256_add_epi64(t, _mm256_srli_si256(t, 8));
            sums[16 * b + k / 16] = _mm256_cvtsi256_si32(t) - 16 * 128;
            sums[16 * b + k / 16 + 1] = _mm256_extract_epi32(t, 4) - 16 * 128;
        }
        d[b] = 1.0f / iscale;
    }
}
#endif

/* one activation row of K: codes q[K], scales d[K/qb], s[K/32] (Q8_1), sums[K/16]; kern: the
   products' kernel (GGOPT_KERN_*: 1 rounds with AVX-512, 2 and 3 with AVX2; the same bits,
   only on a CPU that has them) */
static inline void ggopt_q8_row(int vtype, const float *x, Py_ssize_t K, int bias, int8_t *q,
                                float *d, float *s, int32_t *sums, int kern) {
#if GGOPT_HAVE_VNNI
    if (kern == 1) {
        if (vtype == GGOPT_VD_Q8_K) ggopt_q8_rowk_avx512(x, K, q, d, sums);
        else ggopt_q8_row32_avx512(vtype, x, K, bias, q, d, s, sums);
        return;
    }
    if (kern == 2 || kern == 3) {
        if (vtype == GGOPT_VD_Q8_K) ggopt_q8_rowk_avx2(x, K, q, d, sums);
        else ggopt_q8_row32_avx2(vtype, x, K, bias, q, d, s, sums);
        return;
    }
#else
    (void)kern;
#endif
    if (vtype == GGOPT_VD_Q8_K) {
        for (Py_ssize_t b = 0; b < K / GGOPT_QK_K; b++)
            ggopt_q8_block256(x + b * GGOPT_QK_K, q + b * GGOPT_QK_K, d + b);
    } else {
        for (Py_ssize_t b = 0; b < K / GGOPT_QK; b++)
            ggopt_q8_block32(x + b * GGOPT_QK, q + b * GGOPT_QK, d + b,
                             vtype == GGOPT_VD_Q8_1 ? s + b : NULL, bias);
    }
    ggopt_q8_sums16(q, K, bias, sums);
}

/* ---------------------------------------------------------------- weight packing */

/* per-lane scales of one packed block: 32-blocks use d, m (Q4_1/Q5_1's min) and wsum (Q8_0's
   code sums, for the 128 bias of the activations); the K-quants d, m (dmin), sc (one scale per
   sub-block: 8 of 32 elements for Q4_K/Q5_K, 16 of 16 for the others; Q3_K's minus 32) and mn
   (the sub-blocks' minimums: Q4_K/Q5_K's 8, Q2_K's 16; a packed block stores only those) */
typedef struct {
    float d[GGOPT_LANES], m[GGOPT_LANES];
    int32_t wsum[GGOPT_LANES];
} ggopt_meta32;

typedef struct {
    float d[GGOPT_LANES], m[GGOPT_LANES];
    int32_t sc[16][GGOPT_LANES], mn[16][GGOPT_LANES];
} ggopt_metak;

/* the minimums a K-quant block has (0, 8 or 16) */
static inline int ggopt_k_mins(int wtype) {
    return ggopt_k_sub32(wtype) ? 8 : (ggopt_k_has_min(wtype) ? 16 : 0);
}

/* bytes of one packed block of a group of 16 rows (a multiple of 64) */
static inline Py_ssize_t ggopt_packed_block_bytes(int wtype) {
    return ggopt_k_block_bytes(wtype)
        ? GGOPT_QK_K * GGOPT_LANES + (Py_ssize_t)offsetof(ggopt_metak, mn)
              + ggopt_k_mins(wtype) * GGOPT_LANES * (Py_ssize_t)sizeof(int32_t)
        : GGOPT_QK * GGOPT_LANES + (Py_ssize_t)sizeof(ggopt_meta32);
}

/* element e's code in the packed [e/4][lane][e%4] order */
static inline void ggopt_put_code(uint8_t *codes, int lane, int e, int code) {
    codes[(e >> 2) * (4 * GGOPT_LANES) + lane * 4 + (e & 3)] = (uint8_t)code;
}

static inline void ggopt_pack_block32(int wtype, const uint8_t *b, int lane, uint8_t *codes,
                                      ggopt_meta32 *meta) {
    int q[GGOPT_QK];
    float m = 0.0f;
    int32_t wsum = 0;
    switch (wtype) {
    case GGOPT_Q8_0:
        for (int j = 0; j < GGOPT_QK; j++) { q[j] = (int8_t)b[2 + j]; wsum += q[j]; }
        break;
    case GGOPT_Q4_0: ggopt_codes(b + 2, NULL, q); break;
    case GGOPT_Q4_1: m = ggopt_load_f16(b + 2); ggopt_codes(b + 4, NULL, q); break;
    case GGOPT_Q5_0: ggopt_codes(b + 6, b + 2, q); break;
    case GGOPT_Q5_1: m = ggopt_load_f16(b + 2); ggopt_codes(b + 8, b + 4, q); break;
    }
    for (int j = 0; j < GGOPT_QK; j++) ggopt_put_code(codes, lane, j, q[j]);
    meta->d[lane] = ggopt_load_f16(b);
    meta->m[lane] = m;
    meta->wsum[lane] = wsum;
}

/* a K-quant block's scales (Q4_K/Q5_K: d, dmin, 8 scales and minimums; Q2_K: d, dmin, 16
   scales and minimums; Q3_K (minus 32) and Q6_K: d, 16 scales) */
static inline void ggopt_pack_metak(int wtype, const uint8_t *b, int lane, ggopt_metak *meta) {
    if (wtype == GGOPT_Q2_K || wtype == GGOPT_Q3_K) {
        int q2 = wtype == GGOPT_Q2_K;
        meta->d[lane] = ggopt_load_f16(b + (q2 ? 80 : 108));
        meta->m[lane] = q2 ? ggopt_load_f16(b + 82) : 0.0f;
        for (int j = 0; j < 16; j++) {
            meta->sc[j][lane] = q2 ? b[j] & 0x0f : ggopt_q3_k_scale(j, b + 96) - 32;
            if (q2) meta->mn[j][lane] = b[j] >> 4;
        }
        return;
    }
    if (ggopt_k_has_min(wtype)) {
        meta->d[lane] = ggopt_load_f16(b);
        meta->m[lane] = ggopt_load_f16(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            ggopt_q4_k_scale_min(j, b + 4, &sc, &mn);
            meta->sc[j][lane] = sc;
            meta->mn[j][lane] = mn;
        }
        return;
    }
    meta->d[lane] = ggopt_load_f16(b + 208);
    meta->m[lane] = 0.0f;
    for (int j = 0; j < 16; j++) meta->sc[j][lane] = (int8_t)b[192 + j];
}

static inline void ggopt_pack_blockk(int wtype, const uint8_t *b, int lane, uint8_t *codes,
                                     ggopt_metak *meta) {
    int q[GGOPT_QK_K];
    ggopt_pack_metak(wtype, b, lane, meta);
    ggopt_k_codes(wtype, b, q);
    for (int e = 0; e < GGOPT_QK_K; e++) ggopt_put_code(codes, lane, e, q[e]);
}

#if GGOPT_HAVE_BLOCKS_AVX2

/* 32 codes (element j in byte j) to words k0 .. k0 + 7 of a block's packed codes at their lane */
GGOPT_AVX2_BLOCKS static inline void ggopt_put_words32(uint8_t *codes, int lane, int k0,
                                                     __m256i q) {
    uint32_t word[8];
    _mm256_storeu_si256((__m256i *)word, q);
    uint8_t *dst = codes + k0 * (4 * GGOPT_LANES) + lane * 4;
    for (int k = 0; k < 8; k++) memcpy(dst + k * (4 * GGOPT_LANES), &word[k], 4);
}

/* ggopt_pack_block32 with AVX2 (the same codes and scales): the block's 32 codes decoded at
   once, stored as 8 words of 4 at their lane */
GGOPT_AVX2_BLOCKS static inline void ggopt_pack_block32_avx2(int wtype, const uint8_t *b, int lane,
                                                           uint8_t *codes, ggopt_meta32 *meta) {
    __m256i q;
    float m = 0.0f;
    int32_t wsum = 0;
    if (wtype == GGOPT_Q8_0) {
        q = _mm256_loadu_si256((const __m256i *)(b + 2));
        __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                      _mm256_set1_epi16(1));  /* 8 sums of 4 signed codes */
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        wsum = _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1)));
    } else {
        int off = wtype == GGOPT_Q4_0 ? 2 : (wtype == GGOPT_Q4_1 ? 4 : (wtype == GGOPT_Q5_0 ? 6 : 8));
        const uint8_t *qh = wtype == GGOPT_Q5_0 ? b + 2 : (wtype == GGOPT_Q5_1 ? b + 4 : NULL);
        q = ggopt_codes_avx2(b + off, qh);
        if (wtype == GGOPT_Q4_1 || wtype == GGOPT_Q5_1) m = ggopt_load_f16(b + 2);
    }
    ggopt_put_words32(codes, lane, 0, q);
    meta->d[lane] = ggopt_load_f16(b);
    meta->m[lane] = m;
    meta->wsum[lane] = wsum;
}

/* ggopt_pack_blockk with AVX2 (the same codes and scales): 32 codes decoded at once */
GGOPT_AVX2_BLOCKS static inline void ggopt_pack_blockk_avx2(int wtype, const uint8_t *b, int lane,
                                                          uint8_t *codes, ggopt_metak *meta) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), lo2 = _mm256_set1_epi8(0x03);
    ggopt_pack_metak(wtype, b, lane, meta);
    if (wtype == GGOPT_Q2_K || wtype == GGOPT_Q3_K) {
        /* codes 32k .. 32k + 31: bits 2 (k % 4) of qs[32 (k / 4) + l]; Q3_K's bit k of hmask[l]
           as 4 (bytes kept apart as in the Q5_K case) */
        int q3 = wtype == GGOPT_Q3_K;
        __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + (q3 ? 32 : 16) + 32 * (k >> 2)));
            __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (k & 3)), lo2);
            __m256i h = _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srli_epi16(hm, k), _mm256_set1_epi8(1)), 2);
            ggopt_put_words32(codes, lane, 8 * k, _mm256_or_si256(c, h));
        }
        return;
    }
    if (ggopt_k_has_min(wtype)) {
        /* 64 codes: 32 low nibbles, then the 32 high ones; Q5_K's fifth bits: bit j of each
           qh byte for sub-block j (per byte: shifting 16-bit lanes then masking keeps bytes) */
        int q5 = wtype == GGOPT_Q5_K;
        const __m256i one = _mm256_set1_epi8(1);
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + (q5 ? 48 : 16) + 32 * g));
            __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4);
            __m256i h1 = _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4);
            ggopt_put_words32(codes, lane, 16 * g, _mm256_or_si256(_mm256_and_si256(q, lo4), h0));
            ggopt_put_words32(codes, lane, 16 * g + 8,
                              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), lo4), h1));
        }
        return;
    }
    /* Q6_K: ql[128] | qh[64] | scales[16] | d; per 128 codes, quarter k takes the low (k < 2)
       or high nibbles of ql's first (k even) or second 32 bytes and bits 2k, 2k+1 of qh */
    for (int h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        for (int k = 0; k < 4; k++) {
            __m256i lo = _mm256_and_si256(_mm256_srli_epi16(k & 1 ? l1 : l0, k < 2 ? 0 : 4), lo4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), lo2);
            ggopt_put_words32(codes, lane, 32 * h + 8 * k,
                              _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)));
        }
    }
}
#endif

/* pack rows [0, nrows) (nrows <= 16) of nb blocks each into one group (missing lanes and the
   scales a type does not use zero); vec: with AVX2 where the CPU has it (the same bytes) */
static inline void ggopt_pack_group(int wtype, const char *w, Py_ssize_t ws, int nrows,
                                    Py_ssize_t nb, uint8_t *dst, int vec) {
    Py_ssize_t pbb = ggopt_packed_block_bytes(wtype);
    int bb = ggopt_q_block_bytes(wtype), kq = ggopt_k_block_bytes(wtype) != 0;
    Py_ssize_t ncode = kq ? GGOPT_QK_K * GGOPT_LANES : GGOPT_QK * GGOPT_LANES;
    memset(dst, 0, (size_t)(pbb * nb));
#if GGOPT_HAVE_BLOCKS_AVX2
    if (vec && ggopt_blocks_avx2()) {
        for (int r = 0; r < nrows; r++) {
            const uint8_t *row = (const uint8_t *)(w + r * ws);
            for (Py_ssize_t b = 0; b < nb; b++) {
                uint8_t *blk = dst + b * pbb;
                if (kq)
                    ggopt_pack_blockk_avx2(wtype, row + b * bb, r, blk,
                                           (ggopt_metak *)(blk + ncode));
                else
                    ggopt_pack_block32_avx2(wtype, row + b * bb, r, blk,
                                            (ggopt_meta32 *)(blk + ncode));
            }
        }
        return;
    }
#else
    (void)vec;
#endif
    for (int r = 0; r < nrows; r++) {
        const uint8_t *row = (const uint8_t *)(w + r * ws);
        for (Py_ssize_t b = 0; b < nb; b++) {
            uint8_t *blk = dst + b * pbb;
            if (kq) ggopt_pack_blockk(wtype, row + b * bb, r, blk, (ggopt_metak *)(blk + ncode));
            else ggopt_pack_block32(wtype, row + b * bb, r, blk, (ggopt_meta32 *)(blk + ncode));
        }
    }
}

/* ---------------------------------------------------------------- products */

typedef struct {
    const int8_t *q;       /* rows of K codes, row stride K */
    const float *d, *s;    /* rows of nb scales (and Q8_1's s) */
    const int32_t *sums;   /* rows of K/16 sums */
    Py_ssize_t K, nb;
    int ggml_tiled;        /* K-quants on the AVX2 kernels only: each block's integer sums rounded
                              in ggml's tiled order (_ggml_order_k.h) instead of ggopt's */
} ggopt_q8_rows;

/* the offset of a 32-block type's codes (Q4_0: 8, Q5_0: 16; 0 for the rest) */
static inline int32_t ggopt_code_offset(int wtype) {
    return wtype == GGOPT_Q4_0 ? 8 : (wtype == GGOPT_Q5_0 ? 16 : 0);
}

/* dp[lane] += sum over e in [e0, e1) (multiples of 4) of code(lane, e) * a[e]: codes unsigned
   (u8) against signed activations, or (sgn) signed codes against biased u8 activations. Each
   lane's 4 codes are one 32-bit word, taken apart with shifts, so that the loop over the 16
   lanes vectorizes. */
static inline __attribute__((always_inline)) void ggopt_dp_lanes(
        const uint8_t *codes, const int8_t *a, int e0, int e1, int sgn, int32_t *dp) {
    for (int e = e0; e < e1; e += 4) {
        const uint8_t *c = codes + (e >> 2) * (4 * GGOPT_LANES);
        uint32_t w[GGOPT_LANES];
        memcpy(w, c, sizeof w);
        if (sgn) {
            int32_t a0 = (uint8_t)a[e], a1 = (uint8_t)a[e + 1], a2 = (uint8_t)a[e + 2],
                    a3 = (uint8_t)a[e + 3];
            for (int l = 0; l < GGOPT_LANES; l++)
                dp[l] += a0 * ((int32_t)(w[l] << 24) >> 24) + a1 * ((int32_t)(w[l] << 16) >> 24)
                       + a2 * ((int32_t)(w[l] << 8) >> 24) + a3 * ((int32_t)w[l] >> 24);
        } else {
            int32_t a0 = a[e], a1 = a[e + 1], a2 = a[e + 2], a3 = a[e + 3];
            for (int l = 0; l < GGOPT_LANES; l++)
                dp[l] += a0 * (int32_t)(w[l] & 0xff) + a1 * (int32_t)((w[l] >> 8) & 0xff)
                       + a2 * (int32_t)((w[l] >> 16) & 0xff) + a3 * (int32_t)(w[l] >> 24);
        }
    }
}

/* portable: out[r*ldo + lane] for rows n0..n0+nr of x and the lanes < nl of one group; each
   output the VNNI kernel's integers and float operations in the same order */
GGOPT_MULTIVERSION
static void ggopt_qdot_group_scalar(int wtype, const uint8_t *grp, const ggopt_q8_rows *x,
                                    Py_ssize_t n0, int nr, int nl, float *out, Py_ssize_t ldo) {
    Py_ssize_t pbb = ggopt_packed_block_bytes(wtype), nb = x->nb, K = x->K;
    int kq = ggopt_k_block_bytes(wtype) != 0, bias = wtype == GGOPT_Q8_0;
    int32_t off = ggopt_code_offset(wtype);
    Py_ssize_t ncode = kq ? GGOPT_QK_K * GGOPT_LANES : GGOPT_QK * GGOPT_LANES;
    for (int r = 0; r < nr; r++) {
        const int8_t *xq = x->q + (n0 + r) * K;
        const float *xd = x->d + (n0 + r) * nb, *xs = x->s ? x->s + (n0 + r) * nb : NULL;
        const int32_t *xsum = x->sums + (n0 + r) * (K / 16);
        float acc[GGOPT_LANES] = {0};
        for (Py_ssize_t b = 0; b < nb; b++) {
            const uint8_t *codes = grp + b * pbb;
            int32_t isum[GGOPT_LANES] = {0}, msum[GGOPT_LANES] = {0};
            if (!kq) {
                const ggopt_meta32 *meta = (const ggopt_meta32 *)(codes + ncode);
                ggopt_dp_lanes(codes, xq + b * GGOPT_QK, 0, GGOPT_QK, bias, isum);
                int32_t asum = xsum[2 * b] + xsum[2 * b + 1];
                for (int l = 0; l < GGOPT_LANES; l++) {
                    isum[l] -= bias ? 128 * meta->wsum[l] : off * asum;
                    float t = meta->d[l] * xd[b];
                    acc[l] = acc[l] + t * (float)isum[l];
                    if (xs) acc[l] = acc[l] + meta->m[l] * xs[b];
                }
                continue;
            }
            const ggopt_metak *meta = (const ggopt_metak *)(codes + ncode);
            const int8_t *a = xq + b * GGOPT_QK_K;
            const int32_t *bs = xsum + b * 16;
            int sub = ggopt_k_sub32(wtype) ? 32 : 16, mins = ggopt_k_has_min(wtype);
            int32_t koff = ggopt_k_offset(wtype);
            for (int j = 0; j < GGOPT_QK_K / sub; j++) {
                int32_t dp[GGOPT_LANES] = {0};
                ggopt_dp_lanes(codes, a, sub * j, sub * j + sub, 0, dp);
                int32_t bsum = sub == 32 ? bs[2 * j] + bs[2 * j + 1] : bs[j];
                for (int l = 0; l < GGOPT_LANES; l++) {
                    isum[l] += (dp[l] - koff * bsum) * meta->sc[j][l];
                    if (mins) msum[l] += meta->mn[j][l] * bsum;
                }
            }
            for (int l = 0; l < GGOPT_LANES; l++) {
                float t = meta->d[l] * xd[b];
                acc[l] = acc[l] + t * (float)isum[l];
                if (mins) acc[l] = acc[l] - (meta->m[l] * xd[b]) * (float)msum[l];
            }
        }
        for (int l = 0; l < nl; l++) out[r * ldo + l] = acc[l];
    }
}

#if GGOPT_HAVE_VNNI
/* the VNNI kernel: nr (<= 4) activation rows x 2 groups (32 weight rows) at once */
GGOPT_VNNI static inline __attribute__((always_inline)) void ggopt_qdot_vnni_nr(
        int wtype, const uint8_t *g0, const uint8_t *g1, const ggopt_q8_rows *x, Py_ssize_t n0,
        const int nr, float *acc_out) {
    Py_ssize_t pbb = ggopt_packed_block_bytes(wtype), nb = x->nb, K = x->K;
    int kq = ggopt_k_block_bytes(wtype) != 0, bias = wtype == GGOPT_Q8_0;
    int32_t off = ggopt_code_offset(wtype);
    Py_ssize_t ncode = kq ? GGOPT_QK_K * GGOPT_LANES : GGOPT_QK * GGOPT_LANES;
    __m512 acc[4][2];
    const int8_t *xq[4];
    for (int r = 0; r < nr; r++) {
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        xq[r] = x->q + (n0 + r) * K;
    }
    for (Py_ssize_t b = 0; b < nb; b++) {
        const uint8_t *c0 = g0 + b * pbb, *c1 = g1 + b * pbb;
        if (!kq) {
            __m512i ia[4][2];
            for (int r = 0; r < nr; r++) ia[r][0] = ia[r][1] = _mm512_setzero_si512();
            for (int k4 = 0; k4 < 8; k4++) {
                __m512i w0 = _mm512_loadu_si512(c0 + 64 * k4), w1 = _mm512_loadu_si512(c1 + 64 * k4);
                for (int r = 0; r < nr; r++) {
                    int32_t a4;
                    memcpy(&a4, xq[r] + b * GGOPT_QK + 4 * k4, 4);
                    __m512i xa = _mm512_set1_epi32(a4);
                    if (bias) {
                        ia[r][0] = _mm512_dpbusd_epi32(ia[r][0], xa, w0);
                        ia[r][1] = _mm512_dpbusd_epi32(ia[r][1], xa, w1);
                    } else {
                        ia[r][0] = _mm512_dpbusd_epi32(ia[r][0], w0, xa);
                        ia[r][1] = _mm512_dpbusd_epi32(ia[r][1], w1, xa);
                    }
                }
            }
            const ggopt_meta32 *m0 = (const ggopt_meta32 *)(c0 + ncode);
            const ggopt_meta32 *m1 = (const ggopt_meta32 *)(c1 + ncode);
            const ggopt_meta32 *ms[2] = {m0, m1};
            for (int r = 0; r < nr; r++) {
                Py_ssize_t n = n0 + r;
                __m512 da = _mm512_set1_ps(x->d[n * nb + b]);
                int32_t asum = x->sums[n * (K / 16) + 2 * b] + x->sums[n * (K / 16) + 2 * b + 1];
                for (int g = 0; g < 2; g++) {
                    __m512i isum = bias
                        ? _mm512_sub_epi32(ia[r][g], _mm512_slli_epi32(
                              _mm512_loadu_si512(ms[g]->wsum), 7))
                        : _mm512_sub_epi32(ia[r][g], _mm512_set1_epi32(off * asum));
                    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(ms[g]->d), da);
                    acc[r][g] = _mm512_add_ps(acc[r][g], _mm512_mul_ps(t, _mm512_cvtepi32_ps(isum)));
                    if (x->s)
                        acc[r][g] = _mm512_add_ps(acc[r][g], _mm512_mul_ps(
                            _mm512_loadu_ps(ms[g]->m), _mm512_set1_ps(x->s[n * nb + b])));
                }
            }
        } else {
            const ggopt_metak *ms[2] = {(const ggopt_metak *)(c0 + ncode),
                                        (const ggopt_metak *)(c1 + ncode)};
            __m512i is[4][2];
            for (int r = 0; r < nr; r++) is[r][0] = is[r][1] = _mm512_setzero_si512();
            int sub32 = ggopt_k_sub32(wtype), nsub = sub32 ? 8 : 16, steps = sub32 ? 8 : 4;
            int mins = ggopt_k_mins(wtype);
            int32_t koff = ggopt_k_offset(wtype);
            for (int j = 0; j < nsub; j++) {
                __m512i ia[4][2];
                for (int r = 0; r < nr; r++) ia[r][0] = ia[r][1] = _mm512_setzero_si512();
                for (int k4 = j * steps; k4 < (j + 1) * steps; k4++) {
                    __m512i w0 = _mm512_loadu_si512(c0 + 64 * k4);
                    __m512i w1 = _mm512_loadu_si512(c1 + 64 * k4);
                    for (int r = 0; r < nr; r++) {
                        int32_t a4;
                        memcpy(&a4, xq[r] + b * GGOPT_QK_K + 4 * k4, 4);
                        __m512i xa = _mm512_set1_epi32(a4);
                        ia[r][0] = _mm512_dpbusd_epi32(ia[r][0], w0, xa);
                        ia[r][1] = _mm512_dpbusd_epi32(ia[r][1], w1, xa);
                    }
                }
                for (int g = 0; g < 2; g++) {
                    __m512i sc = _mm512_loadu_si512(ms[g]->sc[j]);
                    for (int r = 0; r < nr; r++) {
                        __m512i dp = ia[r][g];
                        if (koff)
                            dp = _mm512_sub_epi32(dp, _mm512_set1_epi32(
                                koff * x->sums[(n0 + r) * (K / 16) + b * 16 + j]));
                        is[r][g] = _mm512_add_epi32(is[r][g], _mm512_mullo_epi32(dp, sc));
                    }
                }
            }
            for (int r = 0; r < nr; r++) {
                Py_ssize_t n = n0 + r;
                const int32_t *bs = x->sums + n * (K / 16) + b * 16;
                __m512 da = _mm512_set1_ps(x->d[n * nb + b]);
                for (int g = 0; g < 2; g++) {
                    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(ms[g]->d), da);
                    acc[r][g] = _mm512_add_ps(acc[r][g],
                                              _mm512_mul_ps(t, _mm512_cvtepi32_ps(is[r][g])));
                    if (mins) {  /* sum_j mn_j * (the activations' sum over sub-block j) */
                        __m512i msum = _mm512_setzero_si512();
                        for (int j = 0; j < mins; j++)
                            msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(
                                _mm512_loadu_si512(ms[g]->mn[j]),
                                _mm512_set1_epi32(sub32 ? bs[2 * j] + bs[2 * j + 1] : bs[j])));
                        __m512 tm = _mm512_mul_ps(_mm512_loadu_ps(ms[g]->m), da);
                        acc[r][g] = _mm512_sub_ps(acc[r][g],
                                                  _mm512_mul_ps(tm, _mm512_cvtepi32_ps(msum)));
                    }
                }
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm512_storeu_ps(acc_out + r * 32, acc[r][0]);
        _mm512_storeu_ps(acc_out + r * 32 + 16, acc[r][1]);
    }
}

GGOPT_VNNI static void ggopt_qdot_vnni(int wtype, const uint8_t *g0, const uint8_t *g1,
                                       const ggopt_q8_rows *x, Py_ssize_t n0, int nr,
                                       float *acc_out) {
    switch (nr) {
    case 4: ggopt_qdot_vnni_nr(wtype, g0, g1, x, n0, 4, acc_out); break;
    case 3: ggopt_qdot_vnni_nr(wtype, g0, g1, x, n0, 3, acc_out); break;
    case 2: ggopt_qdot_vnni_nr(wtype, g0, g1, x, n0, 2, acc_out); break;
    default: ggopt_qdot_vnni_nr(wtype, g0, g1, x, n0, 1, acc_out); break;
    }
}

static inline int ggopt_cpu_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#else
static inline int ggopt_cpu_has_vnni(void) { return 0; }
#endif

#include "_quant_avx2.h"

/* One panel: rows of 2 groups (g1 may be unused when ml <= 16) against all N activation rows:
   out[n*ldo + m] for m < ml (<= 32). kern: GGOPT_KERN_* (0 portable, 1 AVX-512 VNNI, 2 AVX2,
   3 AVX-VNNI). scratch: 4 x 32 floats. */
static inline void ggopt_qdot_panel(int wtype, const uint8_t *g0, const uint8_t *g1, int ml,
                                    const ggopt_q8_rows *x, Py_ssize_t N, float *out,
                                    Py_ssize_t ldo, int kern, float *scratch) {
    if (ggopt_qdot_panel_avx2(kern, wtype, g0, g1, ml, x, N, out, ldo)) return;
    for (Py_ssize_t n0 = 0; n0 < N; n0 += 4) {
        int nr = N - n0 < 4 ? (int)(N - n0) : 4;
#if GGOPT_HAVE_VNNI
        if (kern == GGOPT_KERN_VNNI) {
            ggopt_qdot_vnni(wtype, g0, g1, x, n0, nr, scratch);
            for (int r = 0; r < nr; r++)
                memcpy(out + (n0 + r) * ldo, scratch + r * 32, (size_t)ml * sizeof(float));
            continue;
        }
#else
        (void)scratch;
#endif
        ggopt_qdot_group_scalar(wtype, g0, x, n0, nr, ml < 16 ? ml : 16, out + n0 * ldo, ldo);
        if (ml > 16)
            ggopt_qdot_group_scalar(wtype, g1, x, n0, nr, ml - 16, out + n0 * ldo + 16, ldo);
    }
}
#endif
