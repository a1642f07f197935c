/* Does AMX tile work overlap with AVX-512 float work on this CPU? (docs/quantized-products.md,
   "The combine at half its throughput")

   Per iteration, on one thread: 40 x 12 independent vaddps (the float combine's kind of work),
   16 tdpbssd configured as ggopt's AMX kernel configures them (16 rows x 32 codes against
   8 x 64 bytes, C tiles 0..3 in turn), 16 tilestored of 16 x 64 bytes, 12 tileloadd; alone and
   together. Times that add up mean the two kinds of work run one after the other.

   gcc -O2 -o /tmp/amx_overlap tools/amx_overlap.c && /tmp/amx_overlap   (Linux, AMX-INT8) */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define AMX __attribute__((target("avx512f,amx-tile,amx-int8"), noinline))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int8_t A[64 * 64] __attribute__((aligned(64)));
static int8_t B[16 * 64] __attribute__((aligned(64)));
static int32_t C[32][256] __attribute__((aligned(64)));

static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.0f + (float)(i));
#define ADD(i) a##i = _mm512_add_ps(a##i, c); __asm__("" : "+v"(a##i));
#define SUM(i) s = _mm512_add_ps(s, a##i);

/* ns per iteration of nf x 12 vaddps, nd tdpbssd, ns tilestored, nl tileloadd */
AMX static double run(long n, int nf, int nd, int ns, int nl) {
    EACH(DECL)
    __m512 c = _mm512_set1_ps(1e-9f);
    double t = thread_seconds();
    for (long k = 0; k < n; k++) {
        for (int j = 0; j < nl; j++) {
            if (j & 1) _tile_loadd(5, A + 64 * 16 * (j & 3), 64);
            else _tile_loadd(4, A + 64 * 16 * (j & 3), 64);
        }
        for (int j = 0; j < nd; j += 4) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
        for (int j = 0; j < ns; j += 4) {
            int32_t *dst = C[(k & 1) * 16 + j];
            _tile_stored(0, dst, 64);
            _tile_stored(1, dst + 256, 64);
            _tile_stored(2, dst + 512, 64);
            _tile_stored(3, dst + 768, 64);
        }
        for (int f = 0; f < nf; f++) { EACH(ADD) }
    }
    t = thread_seconds() - t;
    __m512 s = _mm512_setzero_ps();
    EACH(SUM)
    if (_mm512_reduce_add_ps(s) == 1.5f) puts("");
    return t / (double)n * 1e9;
}

AMX int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
        puts("no AMX: the kernel refused the tile state");
        return 1;
    }
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 4; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }  /* C: 16 x 16 int32 */
    for (int i = 4; i < 6; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 32; }  /* A: 16 x 32 codes */
    for (int i = 6; i < 8; i++) { cfg.rows[i] = 8; cfg.colsb[i] = 64; }   /* B: 8 x 16 x 4 */
    _tile_loadconfig(&cfg);
    memset(A, 1, sizeof A);
    memset(B, 1, sizeof B);
    _tile_loadd(4, A, 64);
    _tile_loadd(5, A, 64);
    _tile_loadd(6, B, 64);
    _tile_loadd(7, B, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const long n = 100000;
    printf("ns per iteration: alone | with the 480 vaddps (sum of the two alone)\n");
    for (int round = 0; round < 3; round++) {
        double f = run(n, 40, 0, 0, 0), d = run(n, 0, 16, 0, 0), s = run(n, 0, 0, 16, 0);
        double l = run(n, 0, 0, 0, 12);
        printf("480 vaddps %.0f | 16 tdpbssd %.0f, %.0f (%.0f) | 16 tilestored %.0f, %.0f (%.0f)"
               " | 12 tileloadd %.0f, %.0f (%.0f) | all four %.0f (%.0f)\n",
               f, d, run(n, 40, 16, 0, 0), f + d, s, run(n, 40, 0, 16, 0), f + s, l,
               run(n, 40, 0, 0, 12), f + l, run(n, 40, 16, 16, 12), f + d + s + l);
    }
    _tile_release();
    return 0;
}
