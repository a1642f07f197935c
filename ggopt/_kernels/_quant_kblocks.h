/* ggml's K-quant super-blocks Q2_K ... Q6_K (256 elements per block): one block's dequantize,
   as ggml's reference C computes it (dequantize_row_q2_K ... _q6_K). The gguf package
   implements no quantizer for them, so ggopt reads and computes with these types but never
   writes them. Byte layouts (little-endian):
     Q2_K (84 bytes): scales[16] (per 16 elements: low nibble the scale, high the minimum) |
       qs[64] | d f16 | dmin f16; element e = 128 h + 32 s + l (l < 32) is bits 2s, 2s+1 of
       qs[32 h + l]; element = d*scale*code - dmin*min
     Q3_K (110 bytes): hmask[32] | qs[64] (2-bit codes as Q2_K's) | scales[12] (sixteen 6-bit
       scales, packed) | d f16; element e's code is its 2 bits minus 4 unless bit e / 32 of
       hmask[e % 32] is set; element = d*(scale - 32)*code
     Q4_K (144 bytes): d f16 | dmin f16 | scales[12] (eight 6-bit scales and eight 6-bit
       minimums, packed) | qs[128]: for each 64 elements, 32 bytes whose low nibbles are the
       first 32 codes and high nibbles the next 32; element = d*scale*code - dmin*min
     Q5_K (176 bytes): Q4_K's d, dmin and scales | qh[32] | qs[128] as Q4_K's; code e (of
       32-element sub-block j = e / 32) adds 16 * bit j of qh[e % 32] to its nibble
     Q6_K (210 bytes): ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] int8 (one per
       16 elements) | d f16; element = d*scale*(code - 32)
   Needs ggopt_load_f16 (from _quant_blocks.h, which includes this file). */
#ifndef GGOPT_QUANT_KBLOCKS_H
#define GGOPT_QUANT_KBLOCKS_H
#include <stdint.h>

enum { GGOPT_Q2_K = 10, GGOPT_Q3_K = 11, GGOPT_Q4_K = 12, GGOPT_Q5_K = 13, GGOPT_Q6_K = 14 };
#define GGOPT_QK_K 256

/* bytes per super-block, 0 for a type that is not a K-quant this file knows */
static inline int ggopt_k_block_bytes(int type) {
    switch (type) {
    case GGOPT_Q2_K: return 84;
    case GGOPT_Q3_K: return 110;
    case GGOPT_Q4_K: return 144;
    case GGOPT_Q5_K: return 176;
    case GGOPT_Q6_K: return 210;
    default: return 0;
    }
}

/* the j-th (0..7) 6-bit scale and minimum of a Q4_K block's 12 packed bytes: bytes 0-3 hold
   scales 0-3 (low 6 bits), 4-7 minimums 0-3; scales/minimums 4-7 take their low 4 bits from
   bytes 8-11 and their top 2 bits from the top bits of bytes 0-3 / 4-7 */
static inline void ggopt_q4_k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* the K-quants' sub-blocks: 32 elements with a scale and a minimum each (Q4_K, Q5_K), or 16
   with a scale (Q3_K, Q6_K: codes offset by 4 / 32) or a scale and a minimum (Q2_K) */
static inline int ggopt_k_sub32(int type) { return type == GGOPT_Q4_K || type == GGOPT_Q5_K; }
static inline int ggopt_k_has_min(int type) { return ggopt_k_sub32(type) || type == GGOPT_Q2_K; }
static inline int ggopt_k_offset(int type) {
    return type == GGOPT_Q3_K ? 4 : (type == GGOPT_Q6_K ? 32 : 0);
}

/* Q3_K's sixteen 6-bit scales (0..63; the value is scale - 32) from its 12 packed bytes: the low
   4 bits of scale j from byte j % 8 (low nibble for j < 8, high for j >= 8), the top 2 from
   bits 2 (j / 4) of byte 8 + j % 4 */
static inline int ggopt_q3_k_scale(int j, const uint8_t *q) {
    return ((q[j & 7] >> (j < 8 ? 0 : 4)) & 0x0f) | (((q[8 + (j & 3)] >> (2 * (j >> 2))) & 3) << 4);
}

/* bit e / 32 of byte e % 32 of hm[32]: element e's high bit (Q3_K's hmask, Q5_K's qh) */
static inline int ggopt_k_hbit(const uint8_t *hm, int e) { return (hm[e & 31] >> (e >> 5)) & 1; }

/* element e's 2-bit code of Q2_K / Q3_K's qs[64] */
static inline int ggopt_k_code2(const uint8_t *qs, int e) {
    return (qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e >> 5) & 3))) & 3;
}

/* a K-quant block's 256 codes as unsigned integers: Q2_K 0..3, Q3_K 0..7 (its value plus 4: the
   2 bits, plus 4 where hmask's bit is set), Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 (value plus 32) */
static inline void ggopt_k_codes(int type, const uint8_t *b, int *codes) {
    switch (type) {
    case GGOPT_Q2_K:
        for (int e = 0; e < GGOPT_QK_K; e++) codes[e] = ggopt_k_code2(b + 16, e);
        break;
    case GGOPT_Q3_K:
        for (int e = 0; e < GGOPT_QK_K; e++)
            codes[e] = ggopt_k_code2(b + 32, e) | ggopt_k_hbit(b, e) << 2;
        break;
    case GGOPT_Q4_K: case GGOPT_Q5_K: {  /* Q5_K: qh[32] before the nibbles */
        const int q5 = type == GGOPT_Q5_K;
        const uint8_t *qs = b + (q5 ? 48 : 16);
        for (int e = 0; e < GGOPT_QK_K; e++) {
            const uint8_t byte = qs[32 * (e >> 6) + (e & 31)];
            codes[e] = ((e & 63) < 32 ? byte & 0x0f : byte >> 4)
                       | (q5 ? ggopt_k_hbit(b + 16, e) << 4 : 0);
        }
        break;
    }
    default:  /* Q6_K: ql[128] | qh[64] | scales[16] | d */
        for (int e = 0; e < GGOPT_QK_K; e++) {
            const int h = e >> 7, qq = (e & 127) >> 5, l = e & 31;
            const int lo = (b[64 * h + (qq & 1) * 32 + l] >> ((qq >> 1) * 4)) & 0x0f;
            codes[e] = lo | ((b[128 + 32 * h + l] >> (2 * qq)) & 3) << 4;
        }
    }
}

static inline void ggopt_dequant_q2_k(const uint8_t *b, float *y) {
    float d = ggopt_load_f16(b + 80), dmin = ggopt_load_f16(b + 82);
    for (int j = 0; j < 16; j++) {
        float dl = d * (float)(b[j] & 0x0f), ml = dmin * (float)(b[j] >> 4);
        for (int l = 0; l < 16; l++) y[16 * j + l] = dl * (float)ggopt_k_code2(b + 16, 16 * j + l) - ml;
    }
}

static inline void ggopt_dequant_q3_k(const uint8_t *b, float *y) {
    float d = ggopt_load_f16(b + 108);
    for (int j = 0; j < 16; j++) {
        float dl = d * (float)(ggopt_q3_k_scale(j, b + 96) - 32);
        for (int l = 0; l < 16; l++) {
            int e = 16 * j + l;
            int q = ggopt_k_code2(b + 32, e) - (ggopt_k_hbit(b, e) ? 0 : 4);
            y[e] = dl * (float)q;
        }
    }
}

/* Q4_K (qh NULL) or Q5_K: element = d*scale*code - dmin*min per 32-element sub-block */
static inline void ggopt_dequant_q45_k(const uint8_t *b, const uint8_t *qh, float *y) {
    float d = ggopt_load_f16(b), dmin = ggopt_load_f16(b + 2);
    const uint8_t *scales = b + 4, *qs = qh ? b + 48 : b + 16;
    for (int g = 0; g < 4; g++) {  /* 64 elements from 32 bytes */
        int s0, m0, s1, m1;
        ggopt_q4_k_scale_min(2 * g, scales, &s0, &m0);
        ggopt_q4_k_scale_min(2 * g + 1, scales, &s1, &m1);
        float d0 = d * (float)s0, min0 = dmin * (float)m0;
        float d1 = d * (float)s1, min1 = dmin * (float)m1;
        const uint8_t *q = qs + 32 * g;
        float *out = y + 64 * g;
        if (qh) {
            for (int l = 0; l < 32; l++)
                out[l] = d0 * (float)((q[l] & 0x0f) | (((qh[l] >> (2 * g)) & 1) << 4)) - min0;
            for (int l = 0; l < 32; l++)
                out[32 + l] = d1 * (float)((q[l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4))
                              - min1;
        } else {
            for (int l = 0; l < 32; l++) out[l] = d0 * (float)(q[l] & 0x0f) - min0;
            for (int l = 0; l < 32; l++) out[32 + l] = d1 * (float)(q[l] >> 4) - min1;
        }
    }
}

/* 32 elements of a Q6_K block: 4 bits of lo[l] from bit lo_shift, 2 of hi[l] from bit hi_shift;
   scale s0 for the first 16, s1 for the next (called with constant shifts, so it vectorizes) */
static inline void ggopt_q6_k_quarter(const uint8_t *lo, const uint8_t *hi, int lo_shift,
                                      int hi_shift, float s0, float s1, float *out) {
    for (int l = 0; l < 32; l++) {
        int q = ((lo[l] >> lo_shift) & 0x0f) | (((hi[l] >> hi_shift) & 3) << 4);
        out[l] = (l < 16 ? s0 : s1) * (float)(q - 32);
    }
}

static inline void ggopt_dequant_q6_k(const uint8_t *b, float *y) {
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = ggopt_load_f16(b + 208), ds[16];
    for (int i = 0; i < 16; i++) ds[i] = d * (float)sc[i];  /* ggml: d * sc * q, left to right */
    /* each 128 elements: 64 ql bytes (low nibbles: quarters 0 and 1, high: 2 and 3) and 32 qh
       bytes (bits 2k, 2k+1: quarter k); one scale per 16 elements */
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const float *s = ds + 8 * h;
        float *out = y + 128 * h;
        ggopt_q6_k_quarter(ql, qh, 0, 0, s[0], s[1], out);
        ggopt_q6_k_quarter(ql + 32, qh, 0, 2, s[2], s[3], out + 32);
        ggopt_q6_k_quarter(ql, qh, 4, 4, s[4], s[5], out + 64);
        ggopt_q6_k_quarter(ql + 32, qh, 4, 6, s[6], s[7], out + 96);
    }
}

static inline void ggopt_k_dequant_block(int type, const uint8_t *b, float *y) {
    if (type == GGOPT_Q2_K) ggopt_dequant_q2_k(b, y);
    else if (type == GGOPT_Q3_K) ggopt_dequant_q3_k(b, y);
    else if (type == GGOPT_Q4_K) ggopt_dequant_q45_k(b, NULL, y);
    else if (type == GGOPT_Q5_K) ggopt_dequant_q45_k(b, b + 16, y);
    else if (type == GGOPT_Q6_K) ggopt_dequant_q6_k(b, y);
}
#endif
