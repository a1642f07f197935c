/* ggml's K-quant super-blocks Q4_K and Q6_K (256 elements per block): one block's dequantize,
   as ggml's reference C computes it (dequantize_row_q4_K / dequantize_row_q6_K). The gguf
   package implements no quantizer for them, so ggopt reads and computes with these types but
   never writes them. Byte layouts (little-endian):
     Q4_K (144 bytes): d f16 | dmin f16 | scales[12] (eight 6-bit scales and eight 6-bit
       minimums, packed) | qs[128]: for each 64 elements, 32 bytes whose low nibbles are the
       first 32 codes and high nibbles the next 32; element = d*scale*code - dmin*min
     Q6_K (210 bytes): ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] int8 (one per
       16 elements) | d f16; element = d*scale*(code - 32)
   Needs ggopt_load_f16 (from _quant_blocks.h, which includes this file). */
#ifndef GGOPT_QUANT_KBLOCKS_H
#define GGOPT_QUANT_KBLOCKS_H
#include <stdint.h>

enum { GGOPT_Q4_K = 12, GGOPT_Q6_K = 14 };
#define GGOPT_QK_K 256

/* bytes per super-block, 0 for a type that is not a K-quant this file knows */
static inline int ggopt_k_block_bytes(int type) {
    switch (type) {
    case GGOPT_Q4_K: return 144;
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

static inline void ggopt_dequant_q4_k(const uint8_t *b, float *y) {
    float d = ggopt_load_f16(b), dmin = ggopt_load_f16(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int g = 0; g < 4; g++) {  /* 64 elements from 32 bytes */
        int s0, m0, s1, m1;
        ggopt_q4_k_scale_min(2 * g, scales, &s0, &m0);
        ggopt_q4_k_scale_min(2 * g + 1, scales, &s1, &m1);
        float d0 = d * (float)s0, min0 = dmin * (float)m0;
        float d1 = d * (float)s1, min1 = dmin * (float)m1;
        const uint8_t *q = qs + 32 * g;
        float *out = y + 64 * g;
        for (int l = 0; l < 32; l++) out[l] = d0 * (float)(q[l] & 0x0f) - min0;
        for (int l = 0; l < 32; l++) out[32 + l] = d1 * (float)(q[l] >> 4) - min1;
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
    if (type == GGOPT_Q4_K) ggopt_dequant_q4_k(b, y);
    else if (type == GGOPT_Q6_K) ggopt_dequant_q6_k(b, y);
}
#endif
