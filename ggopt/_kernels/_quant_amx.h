/* The AMX-INT8 micro-kernel of ggml's integer products (_quant_dot.h): 16 activation rows x one
   panel (2 groups of 16 weight rows) per call. Each block's (or K-quant sub-block's) integer
   sums come from one tile product per group (tdpbssd: signed activations x the codes, which
   fit int8; tdpbusd for Q8_0: the activations biased to u8 x signed codes), exact like the
   VNNI and portable kernels' sums; the float combine is the VNNI kernel's, operation for
   operation, so all three give the same bits.

   The packed group's codes [k/4][lane][4] are a B tile as AMX reads it (k/4 rows of 16 lanes x
   4 bytes); the activation codes are an A tile (16 rows of the block's bytes, row stride K).
   Compiled with a per-function target attribute; used only after ggopt_amx_init() (CPUID
   AMX-TILE/AMX-INT8, the XCR0 tile state, Linux's ARCH_REQ_XCOMP_PERM for XTILEDATA). */
#ifndef GGOPT_QUANT_AMX_H
#define GGOPT_QUANT_AMX_H
#include "_quant_dot.h"

#if GGOPT_HAVE_VNNI && __GNUC__ >= 11 && defined(__linux__)
#define GGOPT_HAVE_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define GGOPT_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))

/* 1 when the CPU has AMX-TILE and AMX-INT8, the OS saves the tile state and Linux lets this
   process use it (asked once; the permission is per process) */
static inline int ggopt_amx_init(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return 0;  /* AMX-TILE, AMX-INT8 */
    if (!(c & (1u << 27))) return 0;                        /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;          /* XTILECFG, XTILEDATA */
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) ggopt_tilecfg;

/* tiles: 0 = A (16 rows x sub bytes), 1/2 = B of the two groups (sub/4 rows x 64 bytes),
   3/4 = their C (16 x 16 int32) */
GGOPT_AMX static inline void ggopt_amx_config(int sub) {
    ggopt_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.colsb[0] = (uint16_t)sub;
    cfg.rows[0] = 16;
    for (int t = 1; t <= 2; t++) { cfg.colsb[t] = 64; cfg.rows[t] = (uint8_t)(sub / 4); }
    for (int t = 3; t <= 4; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    /* gcc 12 does not see that ldtilecfg reads cfg and drops the stores: a barrier keeps them */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* the integer sums of one sub-block for 16 rows x 2 groups into c[2][16][16] */
GGOPT_AMX static inline __attribute__((always_inline)) void ggopt_amx_dp(
        const int8_t *a, Py_ssize_t lda, const uint8_t *b0, const uint8_t *b1, int bias,
        int32_t *c) {
    __asm__ volatile("" : : "r"(a), "r"(b0), "r"(b1), "r"(c) : "memory");
    _tile_zero(3);
    _tile_zero(4);
    _tile_loadd(0, a, lda);
    _tile_loadd(1, b0, 64);
    _tile_loadd(2, b1, 64);
    if (bias) {
        _tile_dpbusd(3, 0, 1);
        _tile_dpbusd(4, 0, 2);
    } else {
        _tile_dpbssd(3, 0, 1);
        _tile_dpbssd(4, 0, 2);
    }
    _tile_stored(3, c, 64);
    _tile_stored(4, c + 256, 64);
    __asm__ volatile("" : : "r"(c) : "memory");  /* gcc's tile asm declares no memory use */
}

/* acc_out[r*32 + lane] for rows n0..n0+15 of x against the groups g0, g1; the float operations
   of ggopt_qdot_vnni_nr in the same order. Call ggopt_amx_config(sub) first on this thread
   (sub: 32, or 16 for Q6_K). acc_out: 16 x 32 floats. */
GGOPT_AMX static void ggopt_qdot_amx16(int wtype, const uint8_t *g0, const uint8_t *g1,
                                      const ggopt_q8_rows *x, Py_ssize_t n0, float *acc_out) {
    Py_ssize_t pbb = ggopt_packed_block_bytes(wtype), nb = x->nb, K = x->K;
    int kq = ggopt_k_block_bytes(wtype) != 0, bias = wtype == GGOPT_Q8_0;
    int32_t off = ggopt_code_offset(wtype);
    Py_ssize_t ncode = kq ? GGOPT_QK_K * GGOPT_LANES : GGOPT_QK * GGOPT_LANES;
    int32_t c[2 * 256] __attribute__((aligned(64)));
    const int8_t *xq = x->q + n0 * K;
    for (int i = 0; i < 16 * 32; i += 16) _mm512_storeu_ps(acc_out + i, _mm512_setzero_ps());
    for (Py_ssize_t b = 0; b < nb; b++) {
        const uint8_t *c0 = g0 + b * pbb, *c1 = g1 + b * pbb;
        if (!kq) {
            const ggopt_meta32 *ms[2] = {(const ggopt_meta32 *)(c0 + ncode),
                                         (const ggopt_meta32 *)(c1 + ncode)};
            ggopt_amx_dp(xq + b * GGOPT_QK, K, c0, c1, bias, c);
            for (int r = 0; r < 16; r++) {
                Py_ssize_t n = n0 + r;
                __m512 da = _mm512_set1_ps(x->d[n * nb + b]);
                int32_t asum = x->sums[n * (K / 16) + 2 * b] + x->sums[n * (K / 16) + 2 * b + 1];
                for (int g = 0; g < 2; g++) {
                    __m512i ia = _mm512_load_si512(c + g * 256 + r * 16);
                    __m512i isum = bias
                        ? _mm512_sub_epi32(ia, _mm512_slli_epi32(
                              _mm512_loadu_si512(ms[g]->wsum), 7))
                        : _mm512_sub_epi32(ia, _mm512_set1_epi32(off * asum));
                    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(ms[g]->d), da);
                    __m512 acc = _mm512_loadu_ps(acc_out + r * 32 + g * 16);
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(t, _mm512_cvtepi32_ps(isum)));
                    if (x->s)
                        acc = _mm512_add_ps(acc, _mm512_mul_ps(
                            _mm512_loadu_ps(ms[g]->m), _mm512_set1_ps(x->s[n * nb + b])));
                    _mm512_storeu_ps(acc_out + r * 32 + g * 16, acc);
                }
            }
            continue;
        }
        const ggopt_metak *ms[2] = {(const ggopt_metak *)(c0 + ncode),
                                    (const ggopt_metak *)(c1 + ncode)};
        int q4k = wtype == GGOPT_Q4_K, sub = q4k ? 32 : 16, nsub = GGOPT_QK_K / sub;
        int32_t is[16][32] __attribute__((aligned(64)));
        memset(is, 0, sizeof is);
        for (int j = 0; j < nsub; j++) {
            ggopt_amx_dp(xq + b * GGOPT_QK_K + j * sub, K, c0 + 16 * j * sub, c1 + 16 * j * sub,
                         0, c);
            for (int g = 0; g < 2; g++) {
                __m512i sc = _mm512_loadu_si512(ms[g]->sc[j]);
                for (int r = 0; r < 16; r++) {
                    __m512i dp = _mm512_load_si512(c + g * 256 + r * 16);
                    if (!q4k)
                        dp = _mm512_sub_epi32(dp, _mm512_set1_epi32(
                            32 * x->sums[(n0 + r) * (K / 16) + b * 16 + j]));
                    __m512i *dst = (__m512i *)&is[r][g * 16];
                    _mm512_store_si512(dst, _mm512_add_epi32(_mm512_load_si512(dst),
                                                             _mm512_mullo_epi32(dp, sc)));
                }
            }
        }
        for (int r = 0; r < 16; r++) {
            Py_ssize_t n = n0 + r;
            const int32_t *bs = x->sums + n * (K / 16) + b * 16;
            __m512 da = _mm512_set1_ps(x->d[n * nb + b]);
            for (int g = 0; g < 2; g++) {
                __m512 acc = _mm512_loadu_ps(acc_out + r * 32 + g * 16);
                __m512 t = _mm512_mul_ps(_mm512_loadu_ps(ms[g]->d), da);
                acc = _mm512_add_ps(acc, _mm512_mul_ps(
                    t, _mm512_cvtepi32_ps(_mm512_load_si512(&is[r][g * 16]))));
                if (q4k) {
                    __m512i msum = _mm512_setzero_si512();
                    for (int j = 0; j < 8; j++)
                        msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(
                            _mm512_loadu_si512(ms[g]->mn[j]),
                            _mm512_set1_epi32(bs[2 * j] + bs[2 * j + 1])));
                    __m512 tm = _mm512_mul_ps(_mm512_loadu_ps(ms[g]->m), da);
                    acc = _mm512_sub_ps(acc, _mm512_mul_ps(tm, _mm512_cvtepi32_ps(msum)));
                }
                _mm512_storeu_ps(acc_out + r * 32 + g * 16, acc);
            }
        }
    }
}

GGOPT_AMX static inline void ggopt_amx_release(void) { _tile_release(); }
#else
#define GGOPT_HAVE_AMX 0
static inline int ggopt_amx_init(void) { return 0; }
#endif

/* ggopt_qdot_panel with the AMX kernel for each whole 16 rows of x (use_amx), the panel's
   kernel for the rest: the same bits. scratch: 16 x 32 floats. */
static inline void ggopt_qdot_panel_amx(int wtype, const uint8_t *g0, const uint8_t *g1, int ml,
                                        const ggopt_q8_rows *x, Py_ssize_t N, float *out,
                                        Py_ssize_t ldo, int use_vnni, int use_amx,
                                        float *scratch) {
    Py_ssize_t n0 = 0;
#if GGOPT_HAVE_AMX
    if (use_amx && N >= 16) {
        ggopt_amx_config(wtype == GGOPT_Q6_K ? 16 : 32);
        for (; n0 + 16 <= N; n0 += 16) {
            ggopt_qdot_amx16(wtype, g0, g1, x, n0, scratch);
            for (int r = 0; r < 16; r++)
                memcpy(out + (n0 + r) * ldo, scratch + r * 32, (size_t)ml * sizeof(float));
        }
        ggopt_amx_release();
    }
#else
    (void)use_amx;
#endif
    if (n0 < N) {
        ggopt_q8_rows rest = *x;
        rest.q += n0 * x->K;
        rest.d += n0 * x->nb;
        if (rest.s) rest.s += n0 * x->nb;
        rest.sums += n0 * (x->K / 16);
        ggopt_qdot_panel(wtype, g0, g1, ml, &rest, N - n0, out + n0 * ldo, ldo, use_vnni,
                         scratch);
    }
}
#endif
