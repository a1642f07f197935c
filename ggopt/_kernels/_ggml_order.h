/* ggml's float order: the rounding of ggml's CPU backend as llama.cpp's x86-64 builds with AVX2
   and FMA compute it (GCC, which fuses `a*b + c*d` into fma(a, b, c*d)), for graphs that ask
   for llama.cpp's bits (docs/ggml-order.md). Every function gives the same bits on any x86-64
   CPU: an AVX2+FMA version (per-function target attributes) where the CPU has them, else the
   same operations lane by lane with fmaf.

   - ggml_v_expf, the 8-lane exp of ggml's vec.h (ARM's optimized-routines polynomial with a
     scaled path for |n| > 126); ggml's tails use libm's expf;
   - hsum8: ggml's hsum_float_8 / tinyBLAS's hsum: (x4+x0) + (x6+x2), (x5+x1) + (x7+x3), then
     the two added;
   - the F32 dot products of mul_mat: ggml_vec_dot_f32 (4 x 8 lanes over 32-element steps,
     GGML_F32x8_REDUCE, then the tail one product at a time) and llamafile's tinyBLAS (one 8-lane
     accumulator over 8-element steps, then hsum8), chosen as ggml chooses (ggml-order.md);
   - the quantized dot products: per 32-block, 8 lanes of 4 consecutive integer products each,
     converted to float and fused-multiply-added with d_w * d_x into 8 lane sums, hsum8, then
     (Q4_1, Q5_1) the blocks' m * s terms summed one after the other with fmaf (as GCC fused
     ggml's `summs += m*s`; m and s are F16 values, so m*s is exact and a plain multiply-add
     gives the same sums). */
#ifndef GGOPT_GGML_ORDER_H
#define GGOPT_GGML_ORDER_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define GGOPT_GO_X86 1
#include <immintrin.h>
#define GGOPT_GO_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define GGOPT_GO_X86 0
#endif

static int ggopt_go_vector = -1; /* 1: the AVX2+FMA versions; 0: lane by lane */

static inline int ggopt_go_use_vector(void) {
    if (ggopt_go_vector < 0) {
#if GGOPT_GO_X86
        __builtin_cpu_init();
        ggopt_go_vector = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                          && __builtin_cpu_supports("f16c");
#else
        ggopt_go_vector = 0;
#endif
    }
    return ggopt_go_vector;
}

static inline float ggopt_go_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ggopt_go_u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ---------------------------------------------------------------- lane by lane */

static inline float ggopt_go_expf1(float x) {
    const float r = 0x1.8p23f;
    float z = fmaf(x, 0x1.715476p+0f, r);
    float n = z - r;
    float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    uint32_t e = ggopt_go_u(z) << 23;
    float k = ggopt_go_f(e + ggopt_go_u(1.0f));
    float u = b * b;
    float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                        fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(k, j, k);
    uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    float s1 = ggopt_go_f(g + 0x7f000000u), s2 = ggopt_go_f(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

static inline float ggopt_go_hsum8_1(const float *v) {
    float r0 = v[4] + v[0], r1 = v[5] + v[1], r2 = v[6] + v[2], r3 = v[7] + v[3];
    return (r0 + r2) + (r1 + r3);
}

/* GGML_F32x8_REDUCE of four 8-lane sums s[q][lane] */
static inline float ggopt_go_reduce4_1(float s[4][8]) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
    float u0 = t[0] + t[4], u1 = t[1] + t[5], u2 = t[2] + t[6], u3 = t[3] + t[7];
    return (u0 + u1) + (u2 + u3);
}

static float ggopt_go_softmax_sum1(const float *wp, float *y, Py_ssize_t n, float mx) {
    double sum = 0;
    Py_ssize_t i = 0;
    float v[8];
    for (; i + 7 < n; i += 8) {
        for (int l = 0; l < 8; l++) v[l] = y[i + l] = ggopt_go_expf1(wp[i + l] - mx);
        sum += (double)ggopt_go_hsum8_1(v);
    }
    for (; i < n; i++) {
        float e = expf(wp[i] - mx);
        sum += (double)e;
        y[i] = e;
    }
    return (float)(1.0 / sum);
}

static void ggopt_go_swiglu1(const float *x, const float *g, float *y, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 7 < n; i += 8)
        for (int l = 0; l < 8; l++) {
            float a = x[i + l];
            y[i + l] = a / (1.0f + ggopt_go_expf1(0.0f - a)) * g[i + l];
        }
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

/* ggml_vec_dot_f32's leftovers after its 32-element steps, as GCC compiled `sum += x[i]*y[i]`
   in llama.cpp's build: the products of whole groups of 4 rounded, then added in order; the
   last n % 4 fused (fmaf). Measured against that build's ggml_vec_dot_f32 for every n % 32. */
static inline float ggopt_go_dot_tail(const float *x, const float *y, Py_ssize_t i, Py_ssize_t n,
                                      float r) {
    Py_ssize_t p = i + ((n - i) & ~(Py_ssize_t)3);
    for (; i < p; i++) r += x[i] * y[i];
    for (; i < n; i++) r = fmaf(x[i], y[i], r);
    return r;
}

static float ggopt_go_dot_vec1(const float *x, const float *y, Py_ssize_t n) {
    float s[4][8] = {{0}};
    Py_ssize_t np = n & ~(Py_ssize_t)31, i = 0;
    for (; i < np; i += 32)
        for (int q = 0; q < 4; q++)
            for (int l = 0; l < 8; l++) s[q][l] = fmaf(x[i + 8 * q + l], y[i + 8 * q + l], s[q][l]);
    return ggopt_go_dot_tail(x, y, i, n, ggopt_go_reduce4_1(s));
}

/* n not a multiple of 8: the last step's missing lanes are zeros (llama.cpp's padded cache) */
static float ggopt_go_dot_tiny1(const float *x, const float *y, Py_ssize_t n) {
    float s[8] = {0};
    for (Py_ssize_t i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] = i + l < n ? fmaf(x[i + l], y[i + l], s[l]) : fmaf(0.0f, 0.0f, s[l]);
    return ggopt_go_hsum8_1(s);
}

/* ---------------------------------------------------------------- AVX2 + FMA */
#if GGOPT_GO_X86
GGOPT_GO_AVX2 static inline __m256 ggopt_go_expf8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f800000)));
    const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 c = _mm256_cmp_ps(an, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                        _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                        _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 plain = _mm256_fmadd_ps(k, j, k);
    if (!_mm256_movemask_ps(c)) return plain;
    const __m256i g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
        _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 d = _mm256_cmp_ps(an, _mm256_set1_ps(192), _CMP_GT_OQ);
    const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    return _mm256_blendv_ps(_mm256_blendv_ps(plain, scaled, c), _mm256_mul_ps(s1, s1), d);
}

GGOPT_GO_AVX2 static inline float ggopt_go_hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

GGOPT_GO_AVX2 static float ggopt_go_softmax_sum8(const float *wp, float *y, Py_ssize_t n,
                                                  float mx) {
    double sum = 0;
    Py_ssize_t i = 0;
    for (; i + 7 < n; i += 8) {
        __m256 v = ggopt_go_expf8(_mm256_sub_ps(_mm256_loadu_ps(wp + i), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(y + i, v);
        sum += (double)ggopt_go_hsum8(v);
    }
    for (; i < n; i++) {
        float e = expf(wp[i] - mx);
        sum += (double)e;
        y[i] = e;
    }
    return (float)(1.0 / sum);
}

GGOPT_GO_AVX2 static void ggopt_go_swiglu8(const float *x, const float *g, float *y,
                                           Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 7 < n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        __m256 s = _mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                  ggopt_go_expf8(_mm256_sub_ps(
                                                      _mm256_setzero_ps(), a))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(g + i)));
    }
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

/* GGML_F32x8_REDUCE of four 8-lane sums */
GGOPT_GO_AVX2 static inline float ggopt_go_reduce4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    const __m256 v = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

/* the first n (< 8) lanes */
GGOPT_GO_AVX2 static inline __m256i ggopt_go_lanes(Py_ssize_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

GGOPT_GO_AVX2 static float ggopt_go_dot_vec8(const float *x, const float *y, Py_ssize_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    Py_ssize_t np = n & ~(Py_ssize_t)31, i = 0;
    for (; i < np; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    return ggopt_go_dot_tail(x, y, i, n, ggopt_go_reduce4(s0, s1, s2, s3));
}

GGOPT_GO_AVX2 static float ggopt_go_dot_tiny8(const float *x, const float *y, Py_ssize_t n) {
    __m256 s = _mm256_setzero_ps();
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        s = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s);
    if (i < n) {  /* zeros in the missing lanes, as in llama.cpp's padded cache */
        const __m256i m = ggopt_go_lanes(n - i);
        s = _mm256_fmadd_ps(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m), s);
    }
    return ggopt_go_hsum8(s);
}

/* tinyBLAS's order for 8 outputs at once: out[i] = dot(a + i lda, y), K padded with zeros */
GGOPT_GO_AVX2 static inline void ggopt_go_tiny8x8(const float *a, Py_ssize_t lda,
                                                  const float *y, Py_ssize_t n, float *out) {
    __m256 s[8];
    for (int r = 0; r < 8; r++) s[r] = _mm256_setzero_ps();
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 yv = _mm256_loadu_ps(y + i);
        for (int r = 0; r < 8; r++) s[r] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + i), yv, s[r]);
    }
    if (i < n) {
        const __m256i m = ggopt_go_lanes(n - i);
        const __m256 yv = _mm256_maskload_ps(y + i, m);
        for (int r = 0; r < 8; r++)
            s[r] = _mm256_fmadd_ps(_mm256_maskload_ps(a + r * lda + i, m), yv, s[r]);
    }
    for (int r = 0; r < 8; r++) out[r] = ggopt_go_hsum8(s[r]);
}

/* ggml_vec_dot_f32's order for 2 outputs at once */
GGOPT_GO_AVX2 static inline void ggopt_go_vec2(const float *a, Py_ssize_t lda, const float *y,
                                               Py_ssize_t n, float *out) {
    __m256 s[2][4];
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 4; q++) s[r][q] = _mm256_setzero_ps();
    Py_ssize_t np = n & ~(Py_ssize_t)31, i = 0;
    for (; i < np; i += 32)
        for (int q = 0; q < 4; q++) {
            const __m256 yv = _mm256_loadu_ps(y + i + 8 * q);
            for (int r = 0; r < 2; r++)
                s[r][q] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + i + 8 * q), yv, s[r][q]);
        }
    for (int r = 0; r < 2; r++)
        out[r] = ggopt_go_dot_tail(a + r * lda, y, np, n,
                                   ggopt_go_reduce4(s[r][0], s[r][1], s[r][2], s[r][3]));
}

/* out[i] = dot(a + i lda, y) for i < M in tinyBLAS's (tiny) or ggml_vec_dot_f32's order */
GGOPT_GO_AVX2 static void ggopt_go_dots8(const float *a, Py_ssize_t lda, Py_ssize_t M,
                                         const float *y, Py_ssize_t n, int tiny, float *out) {
    Py_ssize_t i = 0;
    if (tiny)
        for (; i + 8 <= M; i += 8) ggopt_go_tiny8x8(a + i * lda, lda, y, n, out + i);
    else
        for (; i + 2 <= M; i += 2) ggopt_go_vec2(a + i * lda, lda, y, n, out + i);
    for (; i < M; i++)
        out[i] = tiny ? ggopt_go_dot_tiny8(a + i * lda, y, n) : ggopt_go_dot_vec8(a + i * lda, y, n);
}
#endif

/* ---------------------------------------------------------------- row operations */

/* the max of w[0..n) as ggml's sequential MAX (equal for every row without NaN; a row with a
   NaN gives NaN everywhere either way) */
static float ggopt_go_max1(const float *w, Py_ssize_t n) {
    float mx = -INFINITY;
    for (Py_ssize_t i = 0; i < n; i++) mx = mx > w[i] ? mx : w[i];
    return mx;
}

#if GGOPT_GO_X86
GGOPT_GO_AVX2 static float ggopt_go_prep8(const float *x, const float *mask, float *w,
                                          Py_ssize_t n, float scale) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    const __m256 sv = _mm256_set1_ps(scale);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        if (mask) v = _mm256_add_ps(v, _mm256_loadu_ps(mask + i));
        _mm256_storeu_ps(w + i, v);
        mx = _mm256_max_ps(mx, v);
    }
    float m8[8], m = -INFINITY;
    _mm256_storeu_ps(m8, mx);
    for (int l = 0; l < 8; l++) m = m > m8[l] ? m : m8[l];
    for (; i < n; i++) {
        w[i] = x[i] * scale;
        if (mask) w[i] += mask[i];
        m = m > w[i] ? m : w[i];
    }
    return m;
}

GGOPT_GO_AVX2 static void ggopt_go_scale8(const float *w, float *y, Py_ssize_t n, float v) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i),
                                                                     _mm256_set1_ps(v)));
    for (; i < n; i++) y[i] = w[i] * v;
}
#endif

/* ggml_compute_forward_soft_max_f32 on one row: w = x * scale (+ mask), its max, exp and sum,
   then y scaled by (float)(1 / sum). pad8: the row as llama.cpp's KV cache pads it, with
   masked (-inf) slots to a multiple of 8. w: n rounded up to 8 floats of scratch. */
static void ggopt_go_softmax_row(const float *x, const float *mask, float *y, float *w,
                                 Py_ssize_t n, float scale, int pad8) {
    Py_ssize_t nw = pad8 ? (n + 7) & ~(Py_ssize_t)7 : n;
    for (Py_ssize_t i = n; i < nw; i++) w[i] = -INFINITY;
#if GGOPT_GO_X86
    if (ggopt_go_use_vector()) {
        float mx = ggopt_go_prep8(x, mask, w, n, scale);
        ggopt_go_scale8(w, y, n, ggopt_go_softmax_sum8(w, w, nw, mx));
        return;
    }
#endif
    for (Py_ssize_t i = 0; i < n; i++) w[i] = x[i] * scale;
    if (mask)
        for (Py_ssize_t i = 0; i < n; i++) w[i] += mask[i];
    const float inv = ggopt_go_softmax_sum1(w, w, nw, ggopt_go_max1(w, n));
    for (Py_ssize_t i = 0; i < n; i++) y[i] = w[i] * inv;
}

static void ggopt_go_swiglu_row(const float *x, const float *g, float *y, Py_ssize_t n) {
#if GGOPT_GO_X86
    if (ggopt_go_use_vector()) { ggopt_go_swiglu8(x, g, y, n); return; }
#endif
    ggopt_go_swiglu1(x, g, y, n);
}

/* ggml_compute_forward_rms_norm_f32: the squares (float) summed one after the other in double */
static void ggopt_go_rms_norm_row(const float *x, float *y, Py_ssize_t n, float eps) {
    double sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (Py_ssize_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

/* out[i] = dot(a + i lda, y), i < M: mul_mat's F32 dots in tinyBLAS's order (tiny; n not a
   multiple of 8: padded with zeros) or ggml_vec_dot_f32's */
static void ggopt_go_dots(const float *a, Py_ssize_t lda, Py_ssize_t M, const float *y,
                          Py_ssize_t n, int tiny, float *out) {
#if GGOPT_GO_X86
    if (ggopt_go_use_vector()) { ggopt_go_dots8(a, lda, M, y, n, tiny, out); return; }
#endif
    for (Py_ssize_t i = 0; i < M; i++)
        out[i] = tiny ? ggopt_go_dot_tiny1(a + i * lda, y, n) : ggopt_go_dot_vec1(a + i * lda, y, n);
}

/* ---------------------------------------------------------------- quantized products */

/* the 32 codes of a block of a 32-element type (natural order, signed: Q4_0's and Q5_0's
   offsets taken off) and its d (and Q4_1's, Q5_1's m); block layouts: _quant_blocks.h */
static inline void ggopt_go_decode(int t, const uint8_t *b, int8_t *c, float *d, float *m) {
    *d = ggopt_load_f16(b);
    *m = 0.0f;
    if (t == GGOPT_Q8_0) { memcpy(c, b + 2, 32); return; }
    int q[GGOPT_QK], off = 0;
    switch (t) {
    case GGOPT_Q4_0: ggopt_codes(b + 2, NULL, q); off = 8; break;
    case GGOPT_Q4_1: *m = ggopt_load_f16(b + 2); ggopt_codes(b + 4, NULL, q); break;
    case GGOPT_Q5_0: ggopt_codes(b + 6, b + 2, q); off = 16; break;
    default: *m = ggopt_load_f16(b + 2); ggopt_codes(b + 8, b + 4, q); break;
    }
    for (int e = 0; e < GGOPT_QK; e++) c[e] = (int8_t)(q[e] - off);
}

/* c * q as ggml's sign trick computes it (vpsignb, vpmaddubsw): |c| unsigned times q with
   c's sign, where negating -128 leaves -128 (a NaN or infinite activation's code) */
static inline int32_t ggopt_go_signed_product(int8_t c, int8_t q) {
    const int32_t a = c < 0 ? (uint8_t)(-(int)c) : c;
    const int8_t sq = c < 0 ? (int8_t)(uint8_t)(-(int)q) : (c ? q : 0);
    return a * sq;
}

/* one weight row decoded: its codes c (32 nb int8), the blocks' d and m (nb floats each) */
static void ggopt_go_decode_row(int t, const uint8_t *row, Py_ssize_t nb, int8_t *c, float *d,
                                float *m) {
    const int bb = ggopt_q_block_bytes(t);
    for (Py_ssize_t i = 0; i < nb; i++) ggopt_go_decode(t, row + i * bb, c + 32 * i, d + i, m + i);
}

/* out[k * ldo + r] for rows r0 .. r1-1 of w (nb blocks each, row stride ws bytes) against
   n activation rows: codes q (n x 32 nb, int8), scales d and (Q8_1) s (n x nb floats).
   scratch: 32 nb + 8 nb bytes (a decoded row). */
static void ggopt_go_qdot1(int t, const uint8_t *w, Py_ssize_t ws, Py_ssize_t r0,
                           Py_ssize_t r1, Py_ssize_t nb, const int8_t *q, const float *d,
                           const float *s, Py_ssize_t n, float *out, Py_ssize_t ldo,
                           int8_t *scratch) {
    int8_t *c = scratch;
    float *dw = (float *)(scratch + 32 * nb), *mw = dw + nb;
    for (Py_ssize_t r = r0; r < r1; r++) {
        ggopt_go_decode_row(t, w + r * ws, nb, c, dw, mw);
        for (Py_ssize_t k = 0; k < n; k++) {
            float acc[8] = {0}, summs = 0.0f;
            for (Py_ssize_t i = 0; i < nb; i++) {
                const int8_t *qy = q + (k * nb + i) * 32, *cb = c + 32 * i;
                const float dd = dw[i] * d[k * nb + i];
                if (s) summs = fmaf(mw[i], s[k * nb + i], summs);
                for (int l = 0; l < 8; l++) {
                    int32_t v = 0;
                    for (int e = 4 * l; e < 4 * l + 4; e++) v += ggopt_go_signed_product(cb[e], qy[e]);
                    acc[l] = fmaf(dd, (float)v, acc[l]);
                }
            }
            out[k * ldo + r] = ggopt_go_hsum8_1(acc) + summs;
        }
    }
}

#if GGOPT_GO_X86
/* a block's 32 codes in a register (Q4_0/Q4_1/Q8_0 decoded here, Q5_0/Q5_1 by the portable
   decoder), the same values as ggopt_go_decode */
GGOPT_GO_AVX2 static inline __m256i ggopt_go_codes8(int t, const uint8_t *b) {
    if (t == GGOPT_Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
    if (t == GGOPT_Q4_0 || t == GGOPT_Q4_1) {
        const __m128i qs = _mm_loadu_si128((const __m128i *)(b + (t == GGOPT_Q4_0 ? 2 : 4)));
        const __m128i lo = _mm_and_si128(qs, _mm_set1_epi8(15));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), _mm_set1_epi8(15));
        const __m256i c = _mm256_set_m128i(hi, lo);
        return t == GGOPT_Q4_0 ? _mm256_sub_epi8(c, _mm256_set1_epi8(8)) : c;
    }
    int8_t c[32];
    float d, m;
    ggopt_go_decode(t, b, c, &d, &m);
    return _mm256_loadu_si256((const __m256i *)c);
}

/* nk (<= 8) activation rows k0 .. k0+nk-1 against one decoded row: out[(k0+j) * ldo] */
__attribute__((always_inline)) GGOPT_GO_AVX2 static inline void ggopt_go_qtile(
        int unsig, const int8_t *c, const float *dw, const float *mw, Py_ssize_t nb,
        const int8_t *q, const float *dT, const float *sT, Py_ssize_t n, Py_ssize_t k0,
        const int nk, float *out, Py_ssize_t ldo) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[8];
    float dd[8], sm[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    __m256 summs = _mm256_setzero_ps();
    const __m256i live = ggopt_go_lanes(nk);
    for (Py_ssize_t i = 0; i < nb; i++) {
        const __m256 dx = _mm256_maskload_ps(dT + i * n + k0, live);
        _mm256_storeu_ps(dd, _mm256_mul_ps(_mm256_set1_ps(dw[i]), dx));
        if (unsig)  /* each lane one activation row's fmaf chain */
            summs = _mm256_fmadd_ps(_mm256_set1_ps(mw[i]),
                                    _mm256_maskload_ps(sT + i * n + k0, live), summs);
        const __m256i cw = _mm256_loadu_si256((const __m256i *)(c + 32 * i));
        const __m256i aw = unsig ? cw : _mm256_sign_epi8(cw, cw);
        const int8_t *qi = q + (k0 * nb + i) * 32;
        for (int j = 0; j < nk; j++) {
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(qi + j * nb * 32));
            const __m256i pairs = _mm256_maddubs_epi16(aw, unsig ? qy : _mm256_sign_epi8(qy, cw));
            const __m256 lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + j), lanes, acc[j]);
        }
    }
    _mm256_storeu_ps(sm, summs);
    for (int j = 0; j < nk; j++) out[(k0 + j) * ldo] = ggopt_go_hsum8(acc[j]) + sm[j];
}

/* nr (<= 4) weight rows from r against one activation row (codes qk, scales dk, sk) */
__attribute__((always_inline)) GGOPT_GO_AVX2 static inline void ggopt_go_qrows(
        int t, int unsig, const uint8_t *w, Py_ssize_t ws, Py_ssize_t r, const int nr,
        Py_ssize_t nb, const int8_t *qk, const float *dk, const float *sk, float *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int bb = ggopt_q_block_bytes(t);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float sm[4] = {0, 0, 0, 0};
    for (Py_ssize_t i = 0; i < nb; i++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)(qk + 32 * i));
        for (int j = 0; j < nr; j++) {
            const uint8_t *b = w + (r + j) * ws + i * bb;
            const __m256i cw = ggopt_go_codes8(t, b);
            uint16_t h[2];
            memcpy(h, b, 4);
            const __m256i pairs = unsig ? _mm256_maddubs_epi16(cw, qy)
                : _mm256_maddubs_epi16(_mm256_sign_epi8(cw, cw), _mm256_sign_epi8(qy, cw));
            const __m256 lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(h[0]) * dk[i]), lanes, acc[j]);
            if (unsig) sm[j] = fmaf(_cvtsh_ss(h[1]), sk[i], sm[j]);
        }
    }
    for (int j = 0; j < nr; j++) out[r + j] = ggopt_go_hsum8(acc[j]) + sm[j];
}

#define GGOPT_GO_QROWS(T, U)                                                                 \
    for (; r + 4 <= r1; r += 4) ggopt_go_qrows(T, U, w, ws, r, 4, nb, qk, dk, sk, o);

/* ggopt_go_qdot1's outputs for few activation rows (each on its own): 4 weight rows at a time,
   each block decoded where it is read (the weight type a constant of each loop) */
GGOPT_GO_AVX2 static void ggopt_go_qdot8_few(int t, const uint8_t *w, Py_ssize_t ws,
                                             Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t nb,
                                             const int8_t *q, const float *d, const float *s,
                                             Py_ssize_t n, float *out, Py_ssize_t ldo) {
    const int unsig = t == GGOPT_Q4_1 || t == GGOPT_Q5_1;
    for (Py_ssize_t k = 0; k < n; k++) {
        const int8_t *qk = q + k * nb * 32;
        const float *dk = d + k * nb, *sk = s ? s + k * nb : NULL;
        float *o = out + k * ldo;
        Py_ssize_t r = r0;
        switch (t) {
        case GGOPT_Q4_0: GGOPT_GO_QROWS(GGOPT_Q4_0, 0) break;
        case GGOPT_Q4_1: GGOPT_GO_QROWS(GGOPT_Q4_1, 1) break;
        case GGOPT_Q8_0: GGOPT_GO_QROWS(GGOPT_Q8_0, 0) break;
        default: break;  /* Q5_0, Q5_1: below, one row at a time */
        }
        for (; r < r1; r++) ggopt_go_qrows(t, unsig, w, ws, r, 1, nb, qk, dk, sk, o);
    }
}
#undef GGOPT_GO_QROWS

/* ggopt_go_qdot1's outputs: a row's blocks decoded once into scratch, then 8 activation rows
   at a time, their scales (and Q8_1's s) read per block from dT, sT (nb x n, block-major) */
GGOPT_GO_AVX2 static void ggopt_go_qdot8(int t, const uint8_t *w, Py_ssize_t ws, Py_ssize_t r0,
                                         Py_ssize_t r1, Py_ssize_t nb, const int8_t *q,
                                         const float *dT, const float *sT, Py_ssize_t n,
                                         float *out, Py_ssize_t ldo, int8_t *scratch) {
    const int bb = ggopt_q_block_bytes(t), unsig = t == GGOPT_Q4_1 || t == GGOPT_Q5_1;
    int8_t *c = scratch;
    float *dw = (float *)(scratch + 32 * nb), *mw = dw + nb;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint8_t *row = w + r * ws;
        for (Py_ssize_t i = 0; i < nb; i++) {
            _mm256_storeu_si256((__m256i *)(c + 32 * i), ggopt_go_codes8(t, row + i * bb));
            dw[i] = ggopt_load_f16(row + i * bb);
            mw[i] = unsig ? ggopt_load_f16(row + i * bb + 2) : 0.0f;
        }
        Py_ssize_t k0 = 0;
        if (unsig)  /* constant tile sizes: the sums stay in registers */
            for (; k0 + 8 <= n; k0 += 8)
                ggopt_go_qtile(1, c, dw, mw, nb, q, dT, sT, n, k0, 8, out + r, ldo);
        else
            for (; k0 + 8 <= n; k0 += 8)
                ggopt_go_qtile(0, c, dw, mw, nb, q, dT, sT, n, k0, 8, out + r, ldo);
        if (k0 < n) ggopt_go_qtile(unsig, c, dw, mw, nb, q, dT, sT, n, k0, (int)(n - k0),
                                   out + r, ldo);
    }
}
#endif

/* d, s: the activations' scales (n x nb); dT, sT: the same block-major (nb x n) */
static void ggopt_go_qdot(int t, const uint8_t *w, Py_ssize_t ws, Py_ssize_t r0, Py_ssize_t r1,
                          Py_ssize_t nb, const int8_t *q, const float *d, const float *s,
                          const float *dT, const float *sT, Py_ssize_t n, float *out,
                          Py_ssize_t ldo, int8_t *scratch) {
#if GGOPT_GO_X86
    if (ggopt_go_use_vector()) {
        if (n < 8) ggopt_go_qdot8_few(t, w, ws, r0, r1, nb, q, d, s, n, out, ldo);
        else ggopt_go_qdot8(t, w, ws, r0, r1, nb, q, dT, sT, n, out, ldo, scratch);
        return;
    }
#endif
    ggopt_go_qdot1(t, w, ws, r0, r1, nb, q, d, s, n, out, ldo, scratch);
}

#endif
