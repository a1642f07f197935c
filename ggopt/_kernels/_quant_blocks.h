/* ggml's block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 elements per block): the F16 scale
   conversions and one block's quantize / dequantize, as ggml's reference C computes them
   (ggml-quants.c, *_ref). Byte layouts (little-endian):
     Q4_0: d f16 | 16 bytes of nibbles: element j low nibble of byte j, j+16 its high nibble
     Q4_1: d f16 | m f16 | nibbles as Q4_0
     Q5_0: d f16 | qh u32 (bit j: the fifth bit of element j) | nibbles as Q4_0
     Q5_1: d f16 | m f16 | qh u32 | nibbles
     Q8_0: d f16 | 32 int8
   Only integer code converts half floats, so the flush-to-zero mode changes nothing.
   The K-quants Q4_K, Q5_K and Q6_K (dequantize only): _quant_kblocks.h. */
#ifndef GGOPT_QUANT_BLOCKS_H
#define GGOPT_QUANT_BLOCKS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { GGOPT_Q4_0 = 2, GGOPT_Q4_1 = 3, GGOPT_Q5_0 = 6, GGOPT_Q5_1 = 7, GGOPT_Q8_0 = 8 };
#define GGOPT_QK 32

static inline float ggopt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13);            /* inf, NaN (payload kept) */
    } else if (e != 0) {
        x = sign | ((e + 112u) << 23) | (m << 13);     /* normal: rebias 15 -> 127 */
    } else if (m == 0) {
        x = sign;                                      /* +-0 */
    } else {                                           /* subnormal: normalise */
        e = 113u;
        while (!(m & 0x400u)) { m <<= 1; e--; }
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* round to nearest, ties to even (as NumPy's astype(float16) and x86's F16C) */
static inline uint16_t ggopt_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu, e = ax >> 23;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* >= 65520: inf */
    uint32_t r, rem, half;
    if (e >= 113u) {                                            /* a normal half */
        r = ((e - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
        rem = ax & 0x1fffu;
        half = 0x1000u;
    } else {                                                    /* subnormal or zero */
        uint32_t shift = 126u - e, mant = (ax & 0x7fffffu) | 0x800000u;
        if (e == 0 || shift > 24u) return (uint16_t)sign;
        r = mant >> shift;
        rem = mant & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    }
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

static inline float ggopt_load_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return ggopt_f16_to_f32(h);
}

static inline void ggopt_store_f16(uint8_t *p, float f) {
    uint16_t h = ggopt_f32_to_f16(f);
    memcpy(p, &h, 2);
}

#include "_quant_kblocks.h"

/* bytes per block (super-block for the K-quants), 0 for a type that is not a block type */
static inline int ggopt_q_block_bytes(int type) {
    switch (type) {
    case GGOPT_Q4_0: return 18;
    case GGOPT_Q4_1: return 20;
    case GGOPT_Q5_0: return 22;
    case GGOPT_Q5_1: return 24;
    case GGOPT_Q8_0: return 34;
    default: return ggopt_k_block_bytes(type);
    }
}

/* elements per block: 32, or 256 for the K-quants */
static inline int ggopt_q_block_elems(int type) {
    return ggopt_k_block_bytes(type) ? GGOPT_QK_K : GGOPT_QK;
}

/* 1 for the types with a reference quantizer here (not the K-quants) */
static inline int ggopt_q_can_quantize(int type) {
    return ggopt_k_block_bytes(type) == 0 && ggopt_q_block_bytes(type) != 0;
}

/* the 32 5-bit or 4-bit codes of a block's nibbles (and qh bits, when qh is not NULL) */
static inline void ggopt_codes(const uint8_t *qs, const uint8_t *qh, int *q) {
    uint32_t h = 0;
    if (qh) memcpy(&h, qh, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0f) | (int)(((h >> j) & 1u) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1u) << 4);
    }
}

static inline void ggopt_dequant_block(int type, const uint8_t *b, float *y) {
    int q[GGOPT_QK];
    float d = ggopt_load_f16(b), m;
    switch (type) {
    case GGOPT_Q8_0:
        for (int j = 0; j < GGOPT_QK; j++) y[j] = (float)(int8_t)b[2 + j] * d;
        return;
    case GGOPT_Q4_0:
        ggopt_codes(b + 2, NULL, q);
        for (int j = 0; j < GGOPT_QK; j++) y[j] = d * (float)(q[j] - 8);
        return;
    case GGOPT_Q4_1:
        m = ggopt_load_f16(b + 2);
        ggopt_codes(b + 4, NULL, q);
        for (int j = 0; j < GGOPT_QK; j++) y[j] = d * (float)q[j] + m;
        return;
    case GGOPT_Q5_0:
        ggopt_codes(b + 6, b + 2, q);
        for (int j = 0; j < GGOPT_QK; j++) y[j] = d * (float)(q[j] - 16);
        return;
    case GGOPT_Q5_1:
        m = ggopt_load_f16(b + 2);
        ggopt_codes(b + 8, b + 4, q);
        for (int j = 0; j < GGOPT_QK; j++) y[j] = d * (float)q[j] + m;
        return;
    }
}

/* pack 32 codes as nibbles (and the fifth bits into qh, when qh is not NULL) */
static inline void ggopt_pack(const int *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
        h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    if (qh) memcpy(qh, &h, 4);
}

static inline int ggopt_clamp_code(float v, int top) {
    int q = (int)v;    /* truncation, as ggml's (int8_t) cast */
    return q < 0 ? 0 : (q > top ? top : q);
}

/* the symmetric types: scale from the element of largest magnitude (the first one) */
static inline void ggopt_quant_sym(const float *x, uint8_t *b, int top, float div, float off,
                                   int five) {
    float amax = 0.0f, max = 0.0f;
    int q[GGOPT_QK];
    for (int j = 0; j < GGOPT_QK; j++) {
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    }
    float d = max / div, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < GGOPT_QK; j++) q[j] = ggopt_clamp_code(x[j] * id + off, top);
    ggopt_store_f16(b, d);
    ggopt_pack(q, b + (five ? 6 : 2), five ? b + 2 : NULL);
}

/* the types with a minimum: codes of (x - min) / d */
static inline void ggopt_quant_min(const float *x, uint8_t *b, int top, int five) {
    float min = x[0], max = x[0];
    int q[GGOPT_QK];
    for (int j = 1; j < GGOPT_QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    float d = (max - min) / (float)top, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < GGOPT_QK; j++) q[j] = ggopt_clamp_code((x[j] - min) * id + 0.5f, top);
    ggopt_store_f16(b, d);
    ggopt_store_f16(b + 2, min);
    ggopt_pack(q, b + (five ? 8 : 4), five ? b + 4 : NULL);
}

static inline void ggopt_quant_block(int type, const float *x, uint8_t *b) {
    switch (type) {
    case GGOPT_Q8_0: {
        float amax = 0.0f;
        for (int j = 0; j < GGOPT_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        ggopt_store_f16(b, d);
        for (int j = 0; j < GGOPT_QK; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        return;
    }
    case GGOPT_Q4_0: ggopt_quant_sym(x, b, 15, -8.0f, 8.5f, 0); return;
    case GGOPT_Q5_0: ggopt_quant_sym(x, b, 31, -16.0f, 16.5f, 1); return;
    case GGOPT_Q4_1: ggopt_quant_min(x, b, 15, 0); return;
    case GGOPT_Q5_1: ggopt_quant_min(x, b, 31, 1); return;
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define GGOPT_HAVE_BLOCKS_AVX2 1
#include <immintrin.h>
#define GGOPT_AVX2_BLOCKS __attribute__((target("avx2")))

/* whether this CPU runs the AVX2 block decoding (here and in _quant_dot.h's panels) */
static inline int ggopt_blocks_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

/* 0x10 in byte j where bit j of h is set (a 5-bit type's fifth bits) */
GGOPT_AVX2_BLOCKS static inline __m256i ggopt_fifth_bits(uint32_t h) {
    const __m256i byte_of = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), byte_of), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* the 32 codes of a 4-bit or 5-bit block (element j in byte j): nibbles at qs, fifth bits
   from the u32 at qh (NULL: none) */
GGOPT_AVX2_BLOCKS static inline __m256i ggopt_codes_avx2(const uint8_t *qs, const uint8_t *qh) {
    __m128i nib = _mm_loadu_si128((const __m128i *)qs), lo4 = _mm_set1_epi8(0x0f);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(nib, 4), lo4),
                                 _mm_and_si128(nib, lo4));
    if (qh) {
        uint32_t h;
        memcpy(&h, qh, 4);
        q = _mm256_or_si256(q, ggopt_fifth_bits(h));
    }
    return q;
}

/* n Q5_0 / Q5_1 blocks with AVX2, each element as ggopt_dequant_block computes it (its code,
   minus 16 for Q5_0, converted, times d, plus m for Q5_1; no fused multiply-add) */
GGOPT_AVX2_BLOCKS static void ggopt_dequant_q5_avx2(int type, const uint8_t *src, float *dst,
                                                    Py_ssize_t n) {
    int one = type == GGOPT_Q5_1, bb = one ? 24 : 22;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *b = src + i * bb;
        __m256 d = _mm256_set1_ps(ggopt_load_f16(b));
        __m256 m = _mm256_set1_ps(one ? ggopt_load_f16(b + 2) : 0.0f);
        __m256i q = ggopt_codes_avx2(b + (one ? 8 : 6), b + (one ? 4 : 2));
        uint8_t c[GGOPT_QK];
        _mm256_storeu_si256((__m256i *)c, q);
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + 8 * k)));
            if (!one) v = _mm256_sub_epi32(v, _mm256_set1_epi32(16));
            __m256 y = _mm256_mul_ps(d, _mm256_cvtepi32_ps(v));
            if (one) y = _mm256_add_ps(y, m);
            _mm256_storeu_ps(dst + i * GGOPT_QK + 8 * k, y);
        }
    }
}
#else
#define GGOPT_HAVE_BLOCKS_AVX2 0
static inline int ggopt_blocks_avx2(void) { return 0; }
#endif

/* n blocks of a row; vec: Q5_0 / Q5_1 with AVX2 where the CPU has it (the same values; their
   per-element fifth bits keep the scalar loop from vectorizing, 3-4x slower than the others) */
static inline void ggopt_dequant_row(int type, const uint8_t *src, float *dst, Py_ssize_t n,
                                     int vec) {
    int bb = ggopt_q_block_bytes(type);
#if GGOPT_HAVE_BLOCKS_AVX2
    if (vec && (type == GGOPT_Q5_0 || type == GGOPT_Q5_1)) {
        ggopt_dequant_q5_avx2(type, src, dst, n);
        return;
    }
#else
    (void)vec;
#endif
    if (ggopt_k_block_bytes(type)) {
        for (Py_ssize_t i = 0; i < n; i++)
            ggopt_k_dequant_block(type, src + i * bb, dst + i * GGOPT_QK_K);
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) ggopt_dequant_block(type, src + i * bb, dst + i * GGOPT_QK);
}

static inline void ggopt_quant_row(int type, const float *src, uint8_t *dst, Py_ssize_t n) {
    int bb = ggopt_q_block_bytes(type);
    for (Py_ssize_t i = 0; i < n; i++) ggopt_quant_block(type, src + i * GGOPT_QK, dst + i * bb);
}
#endif
