/* ggml's float order for the K-quant products (Q2_K ... Q6_K weights, activations rounded to
   Q8_K), as llama.cpp's x86 AVX2+FMA build computes mul_mat (docs/ggml-order.md). Both ggml
   paths reduce a super-block of 256 to integers first, which any order gives exactly, then
   round in their own float order:

   - the 8 lanes of ggml's AVX2 vec_dot: lane l sums sc(e) * code(e) * y(e) over the elements
     e with e % 32 in [4l, 4l + 4) (sc: the scale of e's 16 or 32 elements; code: Q3_K's signed
     value, the others' unsigned code). Q6_K's lanes take its unsigned codes, then subtract
     32 * (sc[2l] bsum[2l] + sc[2l+1] bsum[2l+1]) (bsum: Q8_K's sums of 16 codes).
   - S1 = the lanes' sum (= sum sc * value * y), S2 = sum over sub-blocks of min * bsum.

   With fewer than 8 activation rows ggml runs vec_dot (d = d_y * d_w, dmin = -(d_y * dmin_w)):
     Q2_K: acc_l = fma(dmin, mn[2l] bsum[2l] + mn[2l+1] bsum[2l+1], acc_l), then
           acc_l = fma(d, lane_l, acc_l); the result hsum8(acc)
     Q3_K, Q6_K: acc_l = fma(d, lane_l, acc_l); hsum8(acc)
     Q4_K: the same, and m_i = fma(dmin, M_i, m_i) for i < 4 with M_i = mn[2i] b32[2i] +
           mn[2i+1] b32[2i+1] (b32: sums of 32 codes); hsum8(acc) + ((m0 + m2) + (m1 + m3))
     Q5_K: the same, with one s = fma(dmin, M_0 + M_1 + M_2 + M_3, s); hsum8(acc) + s
   From 8 rows on, its tiled K-quant matmul: acc = 0, then per super-block
     r = d_w * S1; r = fma(-dmin_w, S2, r) (types with minimums); acc = fma(r, d_y, acc). */
#ifndef GGOPT_GGML_ORDER_K_H
#define GGOPT_GGML_ORDER_K_H

#include "_ggml_order.h"

/* one super-block decoded: u the unsigned codes (Q3_K: value + 4, Q6_K: value + 32), sc the
   scale of each 16 elements (Q4_K/Q5_K: each 32-element scale twice), scv the scales as the
   AVX2 lanes take them (per 32 elements: 8 times sc[2c], 8 times sc[2c+1]), mn the minimums
   (Q2_K: 16; Q4_K/Q5_K: 8) */
typedef struct {
    uint8_t u[256];
    int16_t scv[8][16];
    int32_t sc[16], mn[16];
    float d, dmin;
} ggopt_gok_block;

static void ggopt_gok_decode(int t, const uint8_t *b, ggopt_gok_block *k) {
    int codes[GGOPT_QK_K];
    ggopt_k_codes(t, b, codes);
    for (int e = 0; e < GGOPT_QK_K; e++) k->u[e] = (uint8_t)codes[e];
    k->dmin = 0.0f;
    memset(k->mn, 0, sizeof k->mn);
    switch (t) {
    case GGOPT_Q2_K:
        k->d = ggopt_load_f16(b + 80);
        k->dmin = ggopt_load_f16(b + 82);
        for (int j = 0; j < 16; j++) { k->sc[j] = b[j] & 15; k->mn[j] = b[j] >> 4; }
        break;
    case GGOPT_Q3_K:
        k->d = ggopt_load_f16(b + 108);
        for (int j = 0; j < 16; j++) k->sc[j] = ggopt_q3_k_scale(j, b + 96) - 32;
        break;
    case GGOPT_Q6_K:
        k->d = ggopt_load_f16(b + 208);
        for (int j = 0; j < 16; j++) k->sc[j] = (int8_t)b[192 + j];
        break;
    default: /* Q4_K, Q5_K */
        k->d = ggopt_load_f16(b);
        k->dmin = ggopt_load_f16(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            ggopt_q4_k_scale_min(j, b + 4, &sc, &mn);
            k->sc[2 * j] = k->sc[2 * j + 1] = sc;
            k->mn[j] = mn;
        }
    }
    for (int c = 0; c < 8; c++)
        for (int l = 0; l < 16; l++) k->scv[c][l] = (int16_t)k->sc[2 * c + (l >> 3)];
}

/* Q6_K's lane corrections and the minimums' sums (bs: the 16 sums of 16 codes of Q8_K) */
static inline int32_t ggopt_gok_q6_fix(const ggopt_gok_block *k, const int32_t *bs, int l) {
    return 32 * (k->sc[2 * l] * bs[2 * l] + k->sc[2 * l + 1] * bs[2 * l + 1]);
}

static inline int32_t ggopt_gok_min32(const ggopt_gok_block *k, const int32_t *bs, int i) {
    return k->mn[2 * i] * (bs[4 * i] + bs[4 * i + 1])
           + k->mn[2 * i + 1] * (bs[4 * i + 2] + bs[4 * i + 3]);
}

static inline int32_t ggopt_gok_s2(int t, const ggopt_gok_block *k, const int32_t *bs) {
    int32_t s = 0;
    if (t == GGOPT_Q2_K)
        for (int j = 0; j < 16; j++) s += k->mn[j] * bs[j];
    else
        for (int i = 0; i < 4; i++) s += ggopt_gok_min32(k, bs, i);
    return s;
}

static void ggopt_gok_lanes1(int t, const ggopt_gok_block *k, const int8_t *y,
                             const int32_t *bs, int32_t *lane) {
    const int off = t == GGOPT_Q3_K ? 4 : 0;
    for (int l = 0; l < 8; l++) lane[l] = 0;
    for (int e = 0; e < GGOPT_QK_K; e++)
        lane[(e & 31) >> 2] += k->sc[e >> 4] * ((int32_t)k->u[e] - off) * y[e];
    if (t == GGOPT_Q6_K)
        for (int l = 0; l < 8; l++) lane[l] -= ggopt_gok_q6_fix(k, bs, l);
}

/* vec_dot's minimum terms of one block: Q4_K's 4 lanes, Q5_K's one sum */
static inline void ggopt_gok_vec_mins(int t, const ggopt_gok_block *k, const int32_t *b,
                                      float dmin, float *m, float *s) {
    if (t == GGOPT_Q4_K)
        for (int q = 0; q < 4; q++) m[q] = fmaf(dmin, (float)ggopt_gok_min32(k, b, q), m[q]);
    if (t == GGOPT_Q5_K) *s = fmaf(dmin, (float)ggopt_gok_s2(t, k, b), *s);
}

/* vec_dot's result: the lanes' hsum_float_8 h, plus Q4_K's (m0 + m2) + (m1 + m3) or Q5_K's s */
static inline float ggopt_gok_vec_finish(int t, float h, const float *m, float s) {
    if (t == GGOPT_Q4_K) return h + ((m[0] + m[2]) + (m[1] + m[3]));
    if (t == GGOPT_Q5_K) return h + s;
    return h;
}

/* ggml's combine of one output from its blocks' lanes (lanes: nb x 8 ints) */
static float ggopt_gok_vec_combine1(int t, const ggopt_gok_block *w, Py_ssize_t nb,
                                    const int32_t *lanes, const float *dy, const int32_t *bs) {
    float acc[8] = {0}, m[4] = {0}, s = 0.0f;
    for (Py_ssize_t i = 0; i < nb; i++) {
        const ggopt_gok_block *k = w + i;
        const int32_t *b = bs + 16 * i;
        const float d = dy[i] * k->d, dmin = -dy[i] * k->dmin;
        for (int l = 0; l < 8; l++) {
            if (t == GGOPT_Q2_K)
                acc[l] = fmaf(dmin, (float)(k->mn[2 * l] * b[2 * l] + k->mn[2 * l + 1] * b[2 * l + 1]),
                              acc[l]);
            acc[l] = fmaf(d, (float)lanes[8 * i + l], acc[l]);
        }
        ggopt_gok_vec_mins(t, k, b, dmin, m, &s);
    }
    return ggopt_gok_vec_finish(t, ggopt_go_hsum8_1(acc), m, s);
}

static float ggopt_gok_tiled_combine(int t, const ggopt_gok_block *w, Py_ssize_t nb,
                                     const int32_t *lanes, const float *dy, const int32_t *bs) {
    const int mins = ggopt_k_has_min(t);
    float acc = 0.0f;
    for (Py_ssize_t i = 0; i < nb; i++) {
        int32_t s1 = 0;
        for (int l = 0; l < 8; l++) s1 += lanes[8 * i + l];
        float r = w[i].d * (float)s1;
        if (mins) r = fmaf(-w[i].dmin, (float)ggopt_gok_s2(t, w + i, bs + 16 * i), r);
        acc = fmaf(r, dy[i], acc);
    }
    return acc;
}

#if GGOPT_GO_X86
/* the 8 lanes of one block against one activation block, with AVX2 (the same integers) */
GGOPT_GO_AVX2 static inline __m256i ggopt_gok_lanes8(int t, const ggopt_gok_block *k,
                                                     const int8_t *y, const int32_t *bs) {
    __m256i sum = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi8(1);
    for (int c = 0; c < 8; c++) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(k->u + 32 * c));
        const __m256i q = _mm256_loadu_si256((const __m256i *)(y + 32 * c));
        __m256i p = _mm256_maddubs_epi16(u, q);
        if (t == GGOPT_Q3_K)  /* (value + 4) * y - 4 * y, pairwise in 16 bits */
            p = _mm256_sub_epi16(p, _mm256_slli_epi16(_mm256_maddubs_epi16(ones, q), 2));
        const __m256i sc = _mm256_loadu_si256((const __m256i *)k->scv[c]);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(sc, p));
    }
    if (t == GGOPT_Q6_K) {
        int32_t fix[8];
        for (int l = 0; l < 8; l++) fix[l] = ggopt_gok_q6_fix(k, bs, l);
        sum = _mm256_sub_epi32(sum, _mm256_loadu_si256((const __m256i *)fix));
    }
    return sum;
}

/* vec_dot's combine, lanes computed and fused-multiply-added in registers */
GGOPT_GO_AVX2 static float ggopt_gok_vec8(int t, const ggopt_gok_block *w, Py_ssize_t nb,
                                          const int8_t *y, const float *dy, const int32_t *bs) {
    __m256 acc = _mm256_setzero_ps();
    float m[4] = {0}, s = 0.0f;
    for (Py_ssize_t i = 0; i < nb; i++) {
        const ggopt_gok_block *k = w + i;
        const int32_t *b = bs + 16 * i;
        const float d = dy[i] * k->d, dmin = -dy[i] * k->dmin;
        if (t == GGOPT_Q2_K) {
            int32_t p[8];
            for (int l = 0; l < 8; l++) p[l] = k->mn[2 * l] * b[2 * l] + k->mn[2 * l + 1] * b[2 * l + 1];
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin),
                                  _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)p)), acc);
        }
        const __m256i lanes = ggopt_gok_lanes8(t, k, y + 256 * i, b);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
        ggopt_gok_vec_mins(t, k, b, dmin, m, &s);
    }
    return ggopt_gok_vec_finish(t, ggopt_go_hsum8(acc), m, s);
}

#endif

/* out[k * ldo + r] for weight rows r0 .. r1-1 (nb super-blocks each, row stride ws bytes)
   against n activation rows rounded to Q8_K: codes q (n x 256 nb), scales d (n x nb), sums of
   16 codes bs (n x 16 nb). scratch: nb decoded blocks and 8 nb ints. ggml's tiled order from
   8 activation rows on (lane by lane: on AVX2 the products take _quant_avx2.h's packed
   kernel instead, _quant_dot.mul_mat_q8(ggml_tiled=True)), its vec_dot's below. */
static void ggopt_gok_dot(int t, const uint8_t *w, Py_ssize_t ws, Py_ssize_t r0, Py_ssize_t r1,
                          Py_ssize_t nb, const int8_t *q, const float *d, const int32_t *bs,
                          Py_ssize_t n, float *out, Py_ssize_t ldo, void *scratch) {
    ggopt_gok_block *blk = (ggopt_gok_block *)scratch;
    int32_t *lanes = (int32_t *)(blk + nb);
    const int bb = ggopt_k_block_bytes(t), tiled = n >= 8;
    for (Py_ssize_t r = r0; r < r1; r++) {
        for (Py_ssize_t i = 0; i < nb; i++) ggopt_gok_decode(t, w + r * ws + i * bb, blk + i);
        for (Py_ssize_t k = 0; k < n; k++) {
            const int8_t *y = q + k * 256 * nb;
            const float *dk = d + k * nb;
            const int32_t *bk = bs + k * 16 * nb;
            float v;
#if GGOPT_GO_X86
            if (!tiled && ggopt_go_use_vector()) {
                out[k * ldo + r] = ggopt_gok_vec8(t, blk, nb, y, dk, bk);
                continue;
            }
#endif
            for (Py_ssize_t i = 0; i < nb; i++)
                ggopt_gok_lanes1(t, blk + i, y + 256 * i, bk + 16 * i, lanes + 8 * i);
            v = tiled ? ggopt_gok_tiled_combine(t, blk, nb, lanes, dk, bk)
                      : ggopt_gok_vec_combine1(t, blk, nb, lanes, dk, bk);
            out[k * ldo + r] = v;
        }
    }
}

#endif
