/* How far can an AVX2 CPU without VNNI take ggml's integer products past F32?
   (docs/quantized-products.md, "Kernels without AVX-512")

   On one thread, instruction throughput alone (no memory), each loop's operations independent:
   - F32: vfmadd231ps on 10 accumulators (16 FLOP each): the F32 product's roofline;
   - int8: vpmaddubsw + vpaddw (32 u8 x s8 products into 16-bit sums, 64 operations): what
     ggopt's AVX2 kernel (_kernels/_quant_avx2.h) does per 32 products of a 4-bit weight;
   - int8 + the Q4_1 block's float work: per 8 outputs x one 32-code block, 8 of those pairs,
     then the block's epilogue that ggml's rule fixes (_quant_dot.h: vpmaddwd widening the
     16-bit sums, vcvtdq2ps, d_w * d_x, that times the sum, + acc, m_w * s_x, + acc: 1 + 1 + 3
     multiplies + 2 adds);
   - the same pairs with Q4_K's per-sub-block work instead (vpmaddwd by the scale, vpaddd; the
     super-block's minimums and float combine, once per 256 codes, left out: a bound above the
     real one).
   Each block's 16-bit sums start from zero, as the kernel's do. The last two, over the first,
   bound an int8 kernel's speed against an F32 kernel at the F32 roofline.

   gcc -O2 -o /tmp/avx2_int8_peak tools/avx2_int8_peak.c && /tmp/avx2_int8_peak   (x86-64, AVX2) */
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define N 100000000L

/* every register the loops read: operands 1.0f (no subnormal ever reaches a float op), sums 0 */
#define INIT                                                                                    \
    "vpcmpeqd %%ymm15, %%ymm15, %%ymm15\n vpsrld $25, %%ymm15, %%ymm15\n"                      \
    "vpslld $23, %%ymm15, %%ymm15\n" /* 0x3f800000: 1.0f */                                    \
    "vmovaps %%ymm15, %%ymm14\n vmovaps %%ymm15, %%ymm13\n"                                     \
    "vpxor %%xmm0, %%xmm0, %%xmm0\n vpxor %%xmm1, %%xmm1, %%xmm1\n vpxor %%xmm2, %%xmm2, %%xmm2\n" \
    "vpxor %%xmm3, %%xmm3, %%xmm3\n vpxor %%xmm4, %%xmm4, %%xmm4\n vpxor %%xmm5, %%xmm5, %%xmm5\n" \
    "vpxor %%xmm6, %%xmm6, %%xmm6\n vpxor %%xmm7, %%xmm7, %%xmm7\n vpxor %%xmm8, %%xmm8, %%xmm8\n" \
    "vpxor %%xmm9, %%xmm9, %%xmm9\n vpxor %%xmm10, %%xmm10, %%xmm10\n"                           \
    "vpxor %%xmm11, %%xmm11, %%xmm11\n vpxor %%xmm12, %%xmm12, %%xmm12\n"

static double fma_loop(void) {
    double t = now();
    __asm__ volatile(
        INIT
        "mov %0, %%rcx\n"
        "1:\n"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm0\n vfmadd231ps %%ymm14, %%ymm15, %%ymm1\n"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n vfmadd231ps %%ymm14, %%ymm15, %%ymm3\n"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm4\n vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm6\n vfmadd231ps %%ymm14, %%ymm15, %%ymm7\n"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n vfmadd231ps %%ymm14, %%ymm15, %%ymm9\n"
        "dec %%rcx\n jnz 1b\n"
        :: "r"(N)
        : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
          "xmm9", "xmm14", "xmm15");
    return 10.0 * 16.0 * (double)N / (now() - t);  /* FLOP/s */
}

#define PAIR(p, s) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #p "\n vpaddw %%ymm" #p ", %%ymm" #s \
                   ", %%ymm" #s "\n"

static double int8_loop(void) {
    double t = now();
    __asm__ volatile(
        INIT
        "mov %0, %%rcx\n"
        "1:\n"
        PAIR(0, 8) PAIR(1, 9) PAIR(2, 10) PAIR(3, 11) PAIR(4, 8) PAIR(5, 9) PAIR(6, 10)
        PAIR(7, 11)
        "dec %%rcx\n jnz 1b\n"
        :: "r"(N)
        : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
          "xmm9", "xmm10", "xmm11", "xmm14", "xmm15");
    return 8.0 * 64.0 * (double)N / (now() - t);  /* integer operations/s */
}

/* one 8-output group's block: its two 16-bit sums zeroed (as the kernel starts each block's),
   8 pairs into them, then the block's epilogue into acc; four groups per iteration, each with
   its own float accumulator (the kernel's tile has 8) */
#define BLOCK(acc) \
    "vpxor %%xmm8, %%xmm8, %%xmm8\n vpxor %%xmm9, %%xmm9, %%xmm9\n" \
    PAIR(0, 8) PAIR(1, 9) PAIR(2, 8) PAIR(3, 9) PAIR(0, 8) PAIR(1, 9) PAIR(2, 8) PAIR(3, 9) \
    "vpmaddwd %%ymm8, %%ymm13, %%ymm10\n"   /* the 16-bit sums widened */ \
    "vcvtdq2ps %%ymm10, %%ymm10\n" \
    "vmulps %%ymm14, %%ymm15, %%ymm11\n"    /* d_w * d_x */ \
    "vmulps %%ymm11, %%ymm10, %%ymm10\n"    /* times the block's sum */ \
    "vaddps %%ymm10, %%ymm" #acc ", %%ymm" #acc "\n"   /* + acc */ \
    "vmulps %%ymm14, %%ymm13, %%ymm11\n"    /* m_w * s_x */ \
    "vaddps %%ymm11, %%ymm" #acc ", %%ymm" #acc "\n"   /* + acc */

/* Q4_K's 32-code sub-block: the 16-bit sums widened times the sub-block's scale (vpmaddwd)
   into a 32-bit sum; the float work comes once per 256 codes (left out here) */
#define KBLOCK(acc) \
    "vpxor %%xmm8, %%xmm8, %%xmm8\n vpxor %%xmm9, %%xmm9, %%xmm9\n" \
    PAIR(0, 8) PAIR(1, 9) PAIR(2, 8) PAIR(3, 9) PAIR(0, 8) PAIR(1, 9) PAIR(2, 8) PAIR(3, 9) \
    "vpmaddwd %%ymm8, %%ymm13, %%ymm10\n" \
    "vpaddd %%ymm10, %%ymm" #acc ", %%ymm" #acc "\n"

/* a loop of four blocks of B, each into its own accumulator (ymm4..7) */
#define BLOCK_LOOP(name, B)                                                                  \
    static double name(void) {                                                               \
        double t = now();                                                                    \
        __asm__ volatile(                                                                    \
            INIT                                                                             \
            "mov %0, %%rcx\n"                                                                \
            "1:\n"                                                                           \
            B(4) B(5) B(6) B(7)                                                              \
            "dec %%rcx\n jnz 1b\n"                                                          \
            :: "r"(N / 4)                                                                    \
            : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",  \
              "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");                  \
        return 4.0 * 8.0 * 64.0 * (double)(N / 4) / (now() - t);                            \
    }

BLOCK_LOOP(int8_block_loop, BLOCK)
BLOCK_LOOP(int8_kblock_loop, KBLOCK)

static double best(double (*loop)(void)) {  /* the faster of two runs (the clock ramps up) */
    double a = loop(), b = loop();
    return a > b ? a : b;
}

int main(void) {
    double f = best(fma_loop), i = best(int8_loop), b = best(int8_block_loop),
           k = best(int8_kblock_loop);
    printf("F32 FMA:                        %6.1f GFLOP/s\n", f / 1e9);
    printf("vpmaddubsw + vpaddw:            %6.1f GOP/s  (%.2fx F32)\n", i / 1e9, i / f);
    printf("  + the Q4_1 block's float work: %6.1f GOP/s  (%.2fx F32)\n", b / 1e9, b / f);
    printf("  + Q4_K's sub-block scale:      %6.1f GOP/s  (%.2fx F32)\n", k / 1e9, k / f);
    return 0;
}
