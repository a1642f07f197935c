/* The AMX-INT8 kernel of ggml's integer products (_quant_dot.h) for the 32-element block types
   and the K-quants but Q6_K (which stays on the VNNI kernel, ggopt_amx_rows): a thread's
   range of weight panels (32 rows: two packed groups of 16) against strips of up to
   GGOPT_AMX_TILES x 16 activation rows (the rows past the last whole 16 go to the VNNI /
   portable kernel). The tiles are configured once per thread and product.
   32-element blocks: a step is one block: the two groups' B tiles loaded once, then per 16
   activation rows two tile products (tdpbssd: signed activations x the codes, which fit int8;
   a Q8_0 weight's activations are stored signed for these rows), stored as 16 x 16 exact int32
   sums; consecutive row tiles use alternate A and C tiles so their products do not wait on
   each other. Steps are taken in chunks of GGOPT_AMX_CHUNK into two buffers: the tile products
   of chunk c+1 are issued (together: interleaving them with the vector code measured slower)
   before the float combine of chunk c reads chunk c's sums. The combine keeps 8 rows x 32
   outputs in registers over a chunk (a thread's running sums in between).
   K-quants: a panel's codes times their sub-block scales as one or two byte planes, each
   summed over a whole super-block in the C tiles (below, "by planes").
   Either way the float operations are those of ggopt_qdot_vnni_nr in the same order, so the
   AMX, VNNI and portable kernels give the same bits; only the order of the exact integer sums
   differs.

   The packed group's codes [k/4][lane][4] are a B tile as AMX reads it (k/4 rows of 16 lanes x
   4 bytes); the activation codes are an A tile (16 rows of the block's bytes, row stride K).
   Compiled with a per-function target attribute; used only after ggopt_amx_init() (CPUID
   AMX-TILE/AMX-INT8, the XCR0 tile state, Linux's ARCH_REQ_XCOMP_PERM for XTILEDATA). */
#ifndef GGOPT_QUANT_AMX_H
#define GGOPT_QUANT_AMX_H
#include "_quant_dot.h"

/* tile steps per chunk of the 32-element blocks (a step: up to 8 tiles of 16 x 16 int32,
   8 KiB) */
#define GGOPT_AMX_CHUNK 2
/* tiles of 16 activation rows per strip (the B tiles are loaded once per step for them) */
#define GGOPT_AMX_TILES 4
/* activation rows whose 2 x 16 outputs the float combine keeps in registers at once */
#define GGOPT_AMX_RB 8
#define GGOPT_AMX_STEP_INTS (GGOPT_AMX_TILES * 512)

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

/* tiles: 0/1 = A (16 activation rows x kb bytes) of even / odd row tiles, 2/3 = B of the two
   groups (kb / 4 rows x 64 bytes), 4 + 2 * (t & 1) + g = C of row tile t and group g (16 x 16
   int32). kb: 32 (a 32-element block a step: two steps' tile products are in flight, none
   waits for the tile store of the step before) or 64 (the K-quants' planes) */
GGOPT_AMX static inline void ggopt_amx_config(int kb) {
    ggopt_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t <= 1; t++) { cfg.colsb[t] = (uint16_t)kb; cfg.rows[t] = 16; }
    for (int t = 2; t <= 3; t++) { cfg.colsb[t] = 64; cfg.rows[t] = (uint8_t)(kb / 4); }
    for (int t = 4; t <= 7; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    /* gcc 12 does not see that ldtilecfg reads cfg and drops the stores: a barrier keeps them */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* 16 activation rows on the tiles of one parity (A: 0 / 1, C: 4, 5 / 6, 7) against the B
   tiles 2, 3 already loaded: the integer sums (signed x signed) into dst[g][16][16] */
#define GGOPT_AMX_ROWS(A, C0, C1)                                                          \
    do {                                                                                   \
        _tile_zero(C0);                                                                    \
        _tile_zero(C1);                                                                    \
        _tile_loadd(A, a, lda);                                                            \
        _tile_dpbssd(C0, A, 2);                                                            \
        _tile_dpbssd(C1, A, 3);                                                            \
        _tile_stored(C0, dst, 64);                                                         \
        _tile_stored(C1, dst + 256, 64);                                                   \
    } while (0)

/* one unit of a step: its row tile t (16 rows at a + 16 t lda) against the B tiles of the
   two groups (loaded by the unit of t == 0) into dst[t][g][16][16] */
GGOPT_AMX static inline __attribute__((always_inline)) void ggopt_amx_unit(
        const int8_t *a, Py_ssize_t lda, const uint8_t *b0, const uint8_t *b1, int t,
        int32_t *dst) {
    /* gcc's tile asm declares no memory use: barriers order it against the C around it */
    __asm__ volatile("" : : "r"(a), "r"(b0), "r"(b1), "r"(dst) : "memory");
    if (t == 0) {
        _tile_loadd(2, b0, 64);
        _tile_loadd(3, b1, 64);
    }
    a += 16 * t * lda;
    dst += 512 * t;
    if (t & 1) GGOPT_AMX_ROWS(1, 6, 7);
    else GGOPT_AMX_ROWS(0, 4, 5);
    __asm__ volatile("" : : "r"(dst) : "memory");
}

/* the work space of one thread (ggopt_amx_ws_ints int32s, 64-byte aligned): two buffers of
   tile sums, per-strip / per-panel terms and a panel's planes */
typedef struct {
    int32_t *buf[2];  /* GGOPT_AMX_CHUNK steps each, or one super-block's plane sums */
    int32_t *rowt;    /* per row and block: Q4_0/Q5_0 off * sum(codes); a K-quant's 16-bit pairs */
    float *acc;       /* [rows][32 lanes], the outputs' running sums between chunks */
    uint8_t *planes;  /* the K-quants: one panel's planes [block][group][plane][4096] */
} ggopt_amx_ws;

#define GGOPT_AMX_ROWS_MAX (16 * GGOPT_AMX_TILES)
/* planes of a super-block at most and the ints of a buffer of tile sums */
#define GGOPT_AMX_PLANES_MAX 2
#define GGOPT_AMX_BUF_INTS                                                                  \
    (GGOPT_AMX_PLANES_MAX * GGOPT_AMX_STEP_INTS > GGOPT_AMX_CHUNK * GGOPT_AMX_STEP_INTS      \
         ? GGOPT_AMX_PLANES_MAX * GGOPT_AMX_STEP_INTS                                       \
         : GGOPT_AMX_CHUNK * GGOPT_AMX_STEP_INTS)

/* int32s of the work space for nb blocks per row of type wtype */
static inline Py_ssize_t ggopt_amx_ws_ints(int wtype, Py_ssize_t nb) {
    Py_ssize_t planes = ggopt_k_block_bytes(wtype) ? nb * 2 * GGOPT_AMX_PLANES_MAX * 1024 : 0;
    return 2 * GGOPT_AMX_BUF_INTS + GGOPT_AMX_ROWS_MAX * 32 + GGOPT_AMX_ROWS_MAX * 8 * nb
           + planes;
}

static inline void ggopt_amx_ws_init(ggopt_amx_ws *ws, int32_t *p, Py_ssize_t nb) {
    ws->buf[0] = p;
    ws->buf[1] = p + GGOPT_AMX_BUF_INTS;
    ws->acc = (float *)(p + 2 * GGOPT_AMX_BUF_INTS);
    ws->rowt = p + 2 * GGOPT_AMX_BUF_INTS + GGOPT_AMX_ROWS_MAX * 32;
    ws->planes = (uint8_t *)(ws->rowt + GGOPT_AMX_ROWS_MAX * 8 * nb);
}

/* units [u0, u1) of the tile steps from s0 of a strip of nt x 16 rows at xq (unit u: row tile
   u % nt of step s0 + u / nt; step s: block s) into dst (steps GGOPT_AMX_STEP_INTS apart) */
GGOPT_AMX static inline __attribute__((always_inline)) void ggopt_amx_units(
        const int8_t *xq, Py_ssize_t K, const uint8_t *g0, const uint8_t *g1, Py_ssize_t pbb,
        int nt, Py_ssize_t s0, int u0, int u1, int32_t *dst) {
    for (int u = u0; u < u1; u++) {
        Py_ssize_t s = s0 + u / nt;
        ggopt_amx_unit(xq + s * GGOPT_QK, K, g0 + s * pbb, g1 + s * pbb, u % nt,
                       dst + (u / nt) * GGOPT_AMX_STEP_INTS);
    }
}

/* masks of the lanes of a panel's two groups that are outputs (ml <= 32 of them) */
#define GGOPT_MASK0(ml) ((__mmask16)((ml) >= 16 ? 0xffff : (1u << (ml)) - 1))
#define GGOPT_MASK1(ml) ((__mmask16)((ml) <= 16 ? 0 : ((ml) >= 32 ? 0xffff : (1u << ((ml) - 16)) - 1)))

/* 32-element blocks: the float combine of blocks [b0, b0 + cb) of a strip of 16 rows from their
   tile sums ib; the outputs' running sums start at zero (first) or are read from out. corr:
   Q4_0 / Q5_0's per-row offsets (rows of nb), hs: Q4_1 / Q5_1's m * s terms. */
GGOPT_AMX static inline __attribute__((always_inline)) void ggopt_amx_combine32_t(
        const uint8_t *g0, const uint8_t *g1, Py_ssize_t pbb, const ggopt_q8_rows *x,
        Py_ssize_t n0, int r0, int r1, const int32_t *corr, const int hs, Py_ssize_t b0, int cb,
        const int32_t *ib, float *accb, int first, int last, float *out, Py_ssize_t ldo,
        int ml) {
    Py_ssize_t nb = x->nb;
    __mmask16 k0 = GGOPT_MASK0(ml), k1 = GGOPT_MASK1(ml);
    const float *xd = x->d + n0 * nb + b0, *xs = hs ? x->s + n0 * nb + b0 : NULL;
    const int32_t *cr = corr ? corr + b0 : NULL;
    const uint8_t *m0b = g0 + b0 * pbb + GGOPT_QK * GGOPT_LANES;
    const uint8_t *m1b = g1 + b0 * pbb + GGOPT_QK * GGOPT_LANES;
    for (int r = r0; r < r1; r += GGOPT_AMX_RB) {
        __m512 acc[GGOPT_AMX_RB][2];
        for (int i = 0; i < GGOPT_AMX_RB; i++) {
            acc[i][0] = first ? _mm512_setzero_ps() : _mm512_load_ps(accb + (r + i) * 32);
            acc[i][1] = first ? _mm512_setzero_ps() : _mm512_load_ps(accb + (r + i) * 32 + 16);
        }
        for (int bi = 0; bi < cb; bi++) {
            const ggopt_meta32 *m0 = (const ggopt_meta32 *)(m0b + bi * pbb);
            const ggopt_meta32 *m1 = (const ggopt_meta32 *)(m1b + bi * pbb);
            __m512 d0 = _mm512_loadu_ps(m0->d), d1 = _mm512_loadu_ps(m1->d);
            const int32_t *st = ib + bi * GGOPT_AMX_STEP_INTS + (r >> 4) * 512 + (r & 15) * 16;
            for (int i = 0; i < GGOPT_AMX_RB; i++) {
                __m512i i0 = _mm512_load_si512(st + i * 16), i1 = _mm512_load_si512(st + 256 + i * 16);
                if (corr) {
                    __m512i c = _mm512_set1_epi32(cr[(r + i) * nb + bi]);
                    i0 = _mm512_sub_epi32(i0, c);
                    i1 = _mm512_sub_epi32(i1, c);
                }
                __m512 da = _mm512_set1_ps(xd[(r + i) * nb + bi]);
                acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_mul_ps(_mm512_mul_ps(d0, da),
                                                                   _mm512_cvtepi32_ps(i0)));
                acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_mul_ps(_mm512_mul_ps(d1, da),
                                                                   _mm512_cvtepi32_ps(i1)));
                if (hs) {
                    __m512 s = _mm512_set1_ps(xs[(r + i) * nb + bi]);
                    acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_mul_ps(_mm512_loadu_ps(m0->m), s));
                    acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_mul_ps(_mm512_loadu_ps(m1->m), s));
                }
            }
        }
        for (int i = 0; i < GGOPT_AMX_RB; i++) {
            if (last) {
                float *o = out + (n0 + r + i) * ldo;
                _mm512_mask_storeu_ps(o, k0, acc[i][0]);
                _mm512_mask_storeu_ps(o + 16, k1, acc[i][1]);
            } else {
                _mm512_store_ps(accb + (r + i) * 32, acc[i][0]);
                _mm512_store_ps(accb + (r + i) * 32 + 16, acc[i][1]);
            }
        }
    }
}

GGOPT_AMX static void ggopt_amx_combine32(const uint8_t *g0, const uint8_t *g1, Py_ssize_t pbb,
                                          const ggopt_q8_rows *x, Py_ssize_t n0, int r0,
                                          int r1, const int32_t *corr, Py_ssize_t b0, int cb,
                                          const int32_t *ib, float *accb, int first,
                                          int last, float *out, Py_ssize_t ldo, int ml) {
    if (corr)
        ggopt_amx_combine32_t(g0, g1, pbb, x, n0, r0, r1, corr, 0, b0, cb, ib, accb, first, last, out, ldo, ml);
    else if (x->s)
        ggopt_amx_combine32_t(g0, g1, pbb, x, n0, r0, r1, NULL, 1, b0, cb, ib, accb, first, last, out, ldo, ml);
    else
        ggopt_amx_combine32_t(g0, g1, pbb, x, n0, r0, r1, NULL, 0, b0, cb, ib, accb, first, last, out, ldo, ml);
}

static inline int32_t ggopt_pair16(int32_t lo, int32_t hi) {
    return (int32_t)(((uint32_t)lo & 0xffffu) | ((uint32_t)hi << 16));
}

/* ---------------------------------------------------------------- the K-quants by planes

   A K-quant's integer part sum_j sc_j * isum_j (sub-blocks j) is one integer sum over the
   whole super-block once every code is multiplied by its sub-block's scale. Where code * sc
   does not fit a byte it is split into byte "planes" whose weighted sum is code * sc:
     Q4_K, Q5_K (codes <= 15 / 31, scales 0..63 per 32): code * (sc >> 3) (weight 8) and
       code * (sc & 7) (weight 1), unsigned, at most 31 * 7 = 217 (tdpbsud);
     Q2_K (codes <= 3, scales 0..15 per 16): code * sc, one unsigned plane, at most 45;
     Q3_K (codes 0..7 = its value + 4, scales -32..31 per 16): code * (sc >> 3) (8, -28..21)
       and code * (sc & 7) (1, <= 49), signed (tdpbssd); the offset comes off as
       4 * sum_j sc_j * bsum_j (vpdpwssd on 16-bit pairs).
   Q6_K's (code - 32) * sc spans -4064..4096: it stays on the VNNI kernel.
   Each plane is a super-block's B operand in 4 tile steps of K = 64, accumulated in the C
   tiles over the whole super-block for two row tiles and both groups (A 2, B 2, C 4: the 8
   tiles): per 16 x 32 outputs and super-block 2 (or 4) tile stores and one combine, where
   sub-block steps made 8-16 of each. The integers are exact (|plane sum| <= 256 * 217 * 127,
   the weighted sums < 2^31) and equal the sub-block form, so the outputs keep their bits. */

/* 1 for the types the AMX kernel takes by planes; the planes (1 or 2) and whether signed */
static inline int ggopt_amx_by_planes(int wtype) {
    return ggopt_k_block_bytes(wtype) != 0 && wtype != GGOPT_Q6_K;
}
static inline int ggopt_amx_nplanes(int wtype) { return wtype == GGOPT_Q2_K ? 1 : 2; }

/* the byte products c * m of 64 bytes c (each < 128) and per-lane 32-bit multipliers m (one lane
   is 4 bytes): 16-bit multiplies of the even and the odd bytes apart (a negative product
   would borrow from its neighbour) */
GGOPT_AMX static inline __m512i ggopt_amx_mul_bytes(__m512i c, __m512i m) {
    __m512i m16 = _mm512_or_si512(_mm512_and_si512(m, _mm512_set1_epi32(0xffff)),
                                  _mm512_slli_epi32(m, 16));
    const __m512i lo8 = _mm512_set1_epi16(0xff);
    __m512i even = _mm512_mullo_epi16(_mm512_and_si512(c, lo8), m16);
    __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(c, 8), m16);
    return _mm512_or_si512(_mm512_and_si512(even, lo8), _mm512_slli_epi16(odd, 8));
}

/* one packed group's super-block blk (codes [k/4][lane][4], then its ggopt_metak) as planes
   dst[plane][4096], the same layout as the codes */
GGOPT_AMX static void ggopt_amx_planes(int wtype, const uint8_t *blk, uint8_t *dst) {
    const ggopt_metak *m = (const ggopt_metak *)(blk + GGOPT_QK_K * GGOPT_LANES);
    const int sub32 = ggopt_k_sub32(wtype), np = ggopt_amx_nplanes(wtype);
    const int rows = sub32 ? 8 : 4;  /* k/4 rows of a sub-block */
    for (int j = 0; j < (sub32 ? 8 : 16); j++) {
        __m512i sc = _mm512_loadu_si512(m->sc[j]);
        __m512i sh = np == 1 ? sc : _mm512_srai_epi32(sc, 3);
        __m512i sl = _mm512_and_si512(sc, _mm512_set1_epi32(7));
        for (int k = rows * j; k < rows * (j + 1); k++) {
            __m512i c = _mm512_loadu_si512(blk + 64 * k);
            _mm512_storeu_si512(dst + 64 * k, ggopt_amx_mul_bytes(c, sh));
            if (np == 2) _mm512_storeu_si512(dst + 4096 + 64 * k, ggopt_amx_mul_bytes(c, sl));
        }
    }
}

/* C += A x B of signed activations and signed (tdpbssd) or unsigned (tdpbsud) plane bytes (tile
   numbers are immediates) */
#define GGOPT_AMX_DP(sgn, C, A, B)                                                         \
    do {                                                                                   \
        if (sgn) _tile_dpbssd(C, A, B);                                                    \
        else _tile_dpbsud(C, A, B);                                                        \
    } while (0)

/* one plane's sums over a super-block for one or two row tiles (16 rows each at xq, xq + 16 K)
   against the two groups' plane p0 / p1 (signed or unsigned bytes): d[t][g][16][16] */
GGOPT_AMX static inline __attribute__((always_inline)) void ggopt_amx_plane_sums(
        const int8_t *xq, Py_ssize_t K, const uint8_t *p0, const uint8_t *p1, int two, int sgn,
        int32_t *d) {
    __asm__ volatile("" : : "r"(xq), "r"(p0), "r"(p1), "r"(d) : "memory");
    _tile_zero(4);
    _tile_zero(5);
    if (two) {
        _tile_zero(6);
        _tile_zero(7);
    }
    for (int ks = 0; ks < 4; ks++) {
        _tile_loadd(2, p0 + 1024 * ks, 64);
        _tile_loadd(3, p1 + 1024 * ks, 64);
        _tile_loadd(0, xq + 64 * ks, K);
        GGOPT_AMX_DP(sgn, 4, 0, 2);
        GGOPT_AMX_DP(sgn, 5, 0, 3);
        if (two) {
            _tile_loadd(1, xq + 16 * K + 64 * ks, K);
            GGOPT_AMX_DP(sgn, 6, 1, 2);
            GGOPT_AMX_DP(sgn, 7, 1, 3);
        }
    }
    _tile_stored(4, d, 64);
    _tile_stored(5, d + 256, 64);
    if (two) {
        _tile_stored(6, d + 512, 64);
        _tile_stored(7, d + 768, 64);
    }
    __asm__ volatile("" : : "r"(d) : "memory");
}

/* the plane sums of super-block b for the strip's nt row tiles: dst[p][t][g][16][16] */
GGOPT_AMX static void ggopt_amx_block_planes(int wtype, const int8_t *xq, Py_ssize_t K,
                                             Py_ssize_t b, const uint8_t *planes, int nt,
                                             int32_t *dst) {
    int np = ggopt_amx_nplanes(wtype), sgn = wtype == GGOPT_Q3_K;
    const uint8_t *pb = planes + b * 2 * np * 4096;  /* [group][plane][4096] */
    for (int p = 0; p < np; p++)
        for (int t = 0; t < nt; t += 2)
            ggopt_amx_plane_sums(xq + 16 * t * K + b * GGOPT_QK_K, K, pb + p * 4096,
                                 pb + (np + p) * 4096, t + 1 < nt, sgn,
                                 dst + (p * 4 + t) * 512);
}

/* per row and block of a strip: the activations' sub-block sums as 16-bit pairs (rowt[8]; Q4_K
   and Q5_K: 4 pairs of 32-element sums, Q2_K and Q3_K: 8 pairs of 16-element ones) */
static inline void ggopt_amx_row_pairs(int wtype, const int32_t *sums, Py_ssize_t K, int R,
                                       Py_ssize_t nb, int32_t *rowt) {
    int sub32 = ggopt_k_sub32(wtype);
    for (int r = 0; r < R; r++)
        for (Py_ssize_t b = 0; b < nb; b++) {
            const int32_t *bs = sums + r * (K / 16) + b * 16;
            int32_t *rp = rowt + (r * nb + b) * 8;
            for (int p = 0; p < (sub32 ? 4 : 8); p++)
                rp[p] = sub32 ? ggopt_pair16(bs[4 * p] + bs[4 * p + 1], bs[4 * p + 2] + bs[4 * p + 3])
                              : ggopt_pair16(bs[2 * p], bs[2 * p + 1]);
        }
}

/* super-block b of a strip of R rows from its plane sums ib: per output the integer part
   is = 8 s0 + s1 (Q2_K: s0; Q3_K: minus 4 * sum_j sc_j * bsum_j), then the float combine of
   ggopt_qdot_vnni_nr: acc += (d * da) * is and, with minimums, acc -= (dmin * da) * msum
   (msum = sum_j mn_j * bsum_j; both sums over j by vpdpwssd on 16-bit pairs) */
GGOPT_AMX static void ggopt_amx_combine_planes(
        int wtype, const uint8_t *g0, const uint8_t *g1, Py_ssize_t pbb,
        const ggopt_q8_rows *x, Py_ssize_t n0, int R, const int32_t *rowt, Py_ssize_t b,
        const int32_t *ib, float *accb, float *out, Py_ssize_t ldo, int ml) {
    Py_ssize_t nb = x->nb, ncode = GGOPT_QK_K * GGOPT_LANES;
    const ggopt_metak *ms[2] = {(const ggopt_metak *)(g0 + b * pbb + ncode),
                                (const ggopt_metak *)(g1 + b * pbb + ncode)};
    const int np = ggopt_amx_nplanes(wtype), q3 = wtype == GGOPT_Q3_K;
    const int mins = ggopt_k_mins(wtype), npair = ggopt_k_sub32(wtype) ? 4 : 8;
    __m512i lanep[2][8];  /* per group: the 16-bit pairs of the minimums (Q3_K: its scales) */
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < npair && (mins || q3); i++) {
            const int32_t *v0 = q3 ? ms[g]->sc[2 * i] : ms[g]->mn[2 * i];
            const int32_t *v1 = q3 ? ms[g]->sc[2 * i + 1] : ms[g]->mn[2 * i + 1];
            lanep[g][i] = _mm512_or_si512(
                _mm512_and_si512(_mm512_loadu_si512(v0), _mm512_set1_epi32(0xffff)),
                _mm512_slli_epi32(_mm512_loadu_si512(v1), 16));
        }
    __m512 dw[2] = {_mm512_loadu_ps(ms[0]->d), _mm512_loadu_ps(ms[1]->d)};
    __m512 mw[2] = {_mm512_loadu_ps(ms[0]->m), _mm512_loadu_ps(ms[1]->m)};
    __mmask16 k0 = GGOPT_MASK0(ml), k1 = GGOPT_MASK1(ml);
    for (int rr = 0; rr < R; rr++) {
        Py_ssize_t n = n0 + rr;
        const int32_t *rp = rowt + (rr * nb + b) * 8;
        const int32_t *st = ib + (rr >> 4) * 512 + (rr & 15) * 16;
        __m512 da = _mm512_set1_ps(x->d[n * nb + b]);
        float *o = out + n * ldo, *ab = accb + rr * 32;
        __m512 acc[2] = {b == 0 ? _mm512_setzero_ps() : _mm512_load_ps(ab),
                         b == 0 ? _mm512_setzero_ps() : _mm512_load_ps(ab + 16)};
        for (int g = 0; g < 2; g++) {
            const int32_t *sg = st + 256 * g;
            __m512i is = _mm512_load_si512(sg);
            if (np == 2)
                is = _mm512_add_epi32(_mm512_slli_epi32(is, 3),
                                      _mm512_load_si512(sg + GGOPT_AMX_STEP_INTS));
            __m512i t2 = _mm512_setzero_si512();
            for (int p = 0; p < npair && (mins || q3); p++)
                t2 = _mm512_dpwssd_epi32(t2, _mm512_set1_epi32(rp[p]), lanep[g][p]);
            if (q3) is = _mm512_sub_epi32(is, _mm512_slli_epi32(t2, 2));
            __m512 t = _mm512_mul_ps(dw[g], da);
            acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(t, _mm512_cvtepi32_ps(is)));
            if (mins) {
                __m512 tm = _mm512_mul_ps(mw[g], da);
                acc[g] = _mm512_sub_ps(acc[g], _mm512_mul_ps(tm, _mm512_cvtepi32_ps(t2)));
            }
        }
        if (b == nb - 1) {
            _mm512_mask_storeu_ps(o, k0, acc[0]);
            _mm512_mask_storeu_ps(o + 16, k1, acc[1]);
        } else {
            _mm512_store_ps(ab, acc[0]);
            _mm512_store_ps(ab + 16, acc[1]);
        }
    }
}


/* the planes of one panel (its two groups' nb super-blocks): planes[b][g][plane][4096] */
GGOPT_AMX static void ggopt_amx_panel_planes(int wtype, const uint8_t *g0, const uint8_t *g1,
                                             Py_ssize_t nb, uint8_t *planes) {
    Py_ssize_t pbb = ggopt_packed_block_bytes(wtype);
    int np = ggopt_amx_nplanes(wtype);
    for (Py_ssize_t b = 0; b < nb; b++) {
        ggopt_amx_planes(wtype, g0 + b * pbb, planes + (b * 2) * np * 4096);
        ggopt_amx_planes(wtype, g1 + b * pbb, planes + (b * 2 + 1) * np * 4096);
    }
}

/* out[n0 + r][0, ml) for a strip of R = 16 * nt rows of x against one panel (the K-quants:
   its planes already in ws->planes) */
GGOPT_AMX static void ggopt_amx_strip(int wtype, const uint8_t *g0, const uint8_t *g1, int ml,
                                      const ggopt_q8_rows *x, Py_ssize_t n0, int nt, float *out,
                                      Py_ssize_t ldo, const ggopt_amx_ws *ws) {
    Py_ssize_t pbb = ggopt_packed_block_bytes(wtype), nb = x->nb, K = x->K;
    int kq = ggopt_amx_by_planes(wtype), R = 16 * nt;
    int32_t off = ggopt_code_offset(wtype);
    const int32_t *sums = x->sums + n0 * (K / 16);
    const int8_t *xq = x->q + n0 * K;
    if (kq) {
        ggopt_amx_row_pairs(wtype, sums, K, R, nb, ws->rowt);
        /* the tile products of super-block b + 1 are issued before block b's combine */
        ggopt_amx_block_planes(wtype, xq, K, 0, ws->planes, nt, ws->buf[0]);
        for (Py_ssize_t b = 0; b < nb; b++) {
            if (b + 1 < nb)
                ggopt_amx_block_planes(wtype, xq, K, b + 1, ws->planes, nt,
                                       ws->buf[(b + 1) & 1]);
            ggopt_amx_combine_planes(wtype, g0, g1, pbb, x, n0, R, ws->rowt, b,
                                     ws->buf[b & 1], ws->acc, out, ldo, ml);
        }
        return;
    }
    const int32_t *corr = NULL;
    if (off) {  /* Q4_0 / Q5_0: off * the block's code sum, per row */
        for (int r = 0; r < R; r++)
            for (Py_ssize_t b = 0; b < nb; b++)
                ws->rowt[r * nb + b] = off * (sums[r * (K / 16) + 2 * b]
                                              + sums[r * (K / 16) + 2 * b + 1]);
        corr = ws->rowt;
    }
    Py_ssize_t steps = nb, nch = (steps + GGOPT_AMX_CHUNK - 1) / GGOPT_AMX_CHUNK;
    ggopt_amx_units(xq, K, g0, g1, pbb, nt, 0, 0,
                    (int)(steps < GGOPT_AMX_CHUNK ? steps : GGOPT_AMX_CHUNK) * nt, ws->buf[0]);
    /* the tile products of chunk c + 1 are issued before chunk c's combine */
    for (Py_ssize_t c = 0; c < nch; c++) {
        Py_ssize_t s0 = c * GGOPT_AMX_CHUNK, s1 = s0 + GGOPT_AMX_CHUNK;
        if (s1 > steps) s1 = steps;
        Py_ssize_t s2 = s1 + GGOPT_AMX_CHUNK < steps ? s1 + GGOPT_AMX_CHUNK : steps;
        ggopt_amx_units(xq, K, g0, g1, pbb, nt, s1, 0, (int)(s2 - s1) * nt,
                        ws->buf[(c + 1) & 1]);
        ggopt_amx_combine32(g0, g1, pbb, x, n0, 0, R, corr, s0, (int)(s1 - s0),
                            ws->buf[c & 1], ws->acc, c == 0, c == nch - 1, out, ldo, ml);
    }
}

GGOPT_AMX static inline void ggopt_amx_release(void) { _tile_release(); }
#else
#define GGOPT_HAVE_AMX 0
static inline int ggopt_amx_init(void) { return 0; }
static inline Py_ssize_t ggopt_amx_ws_ints(int wtype, Py_ssize_t nb) {
    (void)wtype; (void)nb;
    return 0;
}
#endif

/* bytes of one thread's scratch for ggopt_qdot_panels: a panel's packed groups (unless the
   panels are given), the VNNI kernel's 4 x 32 floats, the AMX work space, alignment */
static inline Py_ssize_t ggopt_qdot_scratch_bytes(int wtype, Py_ssize_t nb, int packed) {
    Py_ssize_t gbytes = ggopt_packed_block_bytes(wtype) * nb;
    Py_ssize_t bytes = (packed ? 0 : (2 * gbytes + 63) / 64 * 64) + 4 * 32 * 4
                       + 4 * ggopt_amx_ws_ints(wtype, nb) + 64;
    return (bytes + 63) / 64 * 64;
}

/* the activation rows [0, ggopt_amx_rows) that the AMX kernel takes (whole 16s; 0 without
   use_amx or AMX, and for Q6_K, whose products need more than two planes). For a Q8_0 weight
   these rows hold signed codes (the AMX products are signed x signed) and the rest biased
   ones (the VNNI kernel's u8 x s8). */
static inline Py_ssize_t ggopt_amx_rows(int wtype, Py_ssize_t N, int use_amx) {
    return GGOPT_HAVE_AMX && use_amx && wtype != GGOPT_Q6_K ? N / 16 * 16 : 0;
}

/* Panels [p0, p1) of out = x W^T: out[n][32p + m] for every n < N and m < min(32, M - 32p).
   The panels are packed (2 groups of gbytes each per panel) or, when packed is NULL, packed
   from the raw rows w (row stride ws) into the scratch one at a time. With use_amx, the first
   ggopt_amx_rows(wtype, N, use_amx) activation rows run the AMX kernel and the rest
   ggopt_qdot_panel with kernel kern (GGOPT_KERN_*); all give the same bits. scratch:
   ggopt_qdot_scratch_bytes, private to the calling thread. */
static inline void ggopt_qdot_panels(int wtype, const uint8_t *packed, const char *w,
                                     Py_ssize_t ws, Py_ssize_t M, const ggopt_q8_rows *x,
                                     Py_ssize_t N, float *out, Py_ssize_t ldo, Py_ssize_t p0,
                                     Py_ssize_t p1, int kern, int use_amx, char *scratch) {
    Py_ssize_t nb = x->nb, gbytes = ggopt_packed_block_bytes(wtype) * nb;
    char *base = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    uint8_t *own = packed ? NULL : (uint8_t *)base;
    float *vscr = (float *)(base + (packed ? 0 : (2 * gbytes + 63) / 64 * 64));
    Py_ssize_t namx = ggopt_amx_rows(wtype, N, use_amx);
#if GGOPT_HAVE_AMX
    ggopt_amx_ws aws;
    ggopt_amx_ws_init(&aws, (int32_t *)(vscr + 4 * 32), nb);
    if (namx) ggopt_amx_config(ggopt_amx_by_planes(wtype) ? 64 : GGOPT_QK);
#endif
    for (Py_ssize_t p = p0; p < p1; p++) {
        int ml = (int)(M - 32 * p < 32 ? M - 32 * p : 32);
        const uint8_t *g0, *g1;
        if (packed) {
            g0 = packed + p * 2 * gbytes;
        } else {
            int vec = kern != GGOPT_KERN_PORTABLE;
            ggopt_pack_group(wtype, w + 32 * p * ws, ws, ml < 16 ? ml : 16, nb, own, vec);
            ggopt_pack_group(wtype, w + (32 * p + 16) * ws, ws, ml > 16 ? ml - 16 : 0, nb,
                             own + gbytes, vec);
            g0 = own;
        }
        g1 = g0 + gbytes;
        Py_ssize_t n0 = 0;
#if GGOPT_HAVE_AMX
        if (namx) {
            if (ggopt_amx_by_planes(wtype)) ggopt_amx_panel_planes(wtype, g0, g1, nb, aws.planes);
            while (n0 < namx) {
                int nt = (int)((namx - n0) / 16 < GGOPT_AMX_TILES ? (namx - n0) / 16
                                                                  : GGOPT_AMX_TILES);
                ggopt_amx_strip(wtype, g0, g1, ml, x, n0, nt, out + 32 * p, ldo, &aws);
                n0 += 16 * nt;
            }
        }
#endif
        if (n0 < N) {
            ggopt_q8_rows rest = *x;
            rest.q += n0 * x->K;
            rest.d += n0 * nb;
            if (rest.s) rest.s += n0 * nb;
            rest.sums += n0 * (x->K / 16);
            ggopt_qdot_panel(wtype, g0, g1, ml, &rest, N - n0, out + n0 * ldo + 32 * p, ldo,
                             kern, vscr);
        }
    }
#if GGOPT_HAVE_AMX
    if (namx) ggopt_amx_release();
#endif
}
#endif
