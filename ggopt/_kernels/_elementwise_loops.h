/* The element-wise kernels' scalar and contiguous loops (ggopt/_kernels/_elementwise.pyx
   includes this after _common.pxd, which brings scalar_math.h, Py_ssize_t and
   GGOPT_MULTIVERSION): one switch per op kind over the scalar math, and one vectorized loop per
   op so that each one vectorizes. */
#ifndef GGOPT_ELEMENTWISE_LOOPS_H
#define GGOPT_ELEMENTWISE_LOOPS_H

#include <stdint.h>

enum { GGOPT_ADD, GGOPT_SUB, GGOPT_MUL, GGOPT_DIV, GGOPT_NBIN };
enum {
    GGOPT_NEG, GGOPT_EXP, GGOPT_LOG, GGOPT_SQR, GGOPT_SQRT, GGOPT_RELU, GGOPT_GELU,
    GGOPT_SILU, GGOPT_TANH, GGOPT_SIGMOID, GGOPT_STEP, GGOPT_ABS, GGOPT_NUN
};

static inline float ggopt_binary1(int op, float x, float y) {
    switch (op) {
    case GGOPT_ADD: return x + y;
    case GGOPT_SUB: return x - y;
    case GGOPT_MUL: return x * y;
    default: return x / y;
    }
}

static inline float ggopt_unary1(int uop, float x) {
    switch (uop) {
    case GGOPT_NEG: return -x;
    case GGOPT_EXP: return ggopt_expf(x);
    case GGOPT_LOG: return logf(x);
    case GGOPT_SQR: return x * x;
    case GGOPT_SQRT: return sqrtf(x);
    case GGOPT_RELU: return ggopt_relu(x);
    case GGOPT_GELU: return ggopt_gelu(x);
    case GGOPT_SILU: return ggopt_silu(x);
    case GGOPT_TANH: return tanhf(x);
    case GGOPT_SIGMOID: return ggopt_sigmoidf(x);
    case GGOPT_STEP: return ggopt_step(x);
    default: return fabsf(x);
    }
}

/* g * f'(x); relu is ggml's mul(step(x), g), so relu'(0) = 0 */
static inline float ggopt_unary_back1(int uop, float x, float g) {
    switch (uop) {
    case GGOPT_NEG: return -g;
    case GGOPT_EXP: return g * ggopt_expf(x);
    case GGOPT_LOG: return g / x;
    case GGOPT_SQR: return g * (2.0f * x);
    case GGOPT_SQRT: return g / (2.0f * sqrtf(x));
    case GGOPT_RELU: return g * ggopt_step(x);
    case GGOPT_GELU: return g * ggopt_gelu_d(x);
    case GGOPT_SILU: return g * ggopt_silu_d(x);
    case GGOPT_TANH: return g * ggopt_tanh_d(x);
    case GGOPT_SIGMOID: return g * ggopt_sigmoid_d(x);
    default: return g * ggopt_sgn(x);
    }
}

/* Contiguous loops, one per op so that each vectorizes (see GGOPT_MULTIVERSION). */
/* The elements before d reaches a 64-byte boundary (at most n; none if d is not float
   aligned): the loops take them one by one, so that the vector stores that follow never
   straddle two cache lines (as memcpy does; NumPy's arrays are 16-byte aligned). */
static inline Py_ssize_t ggopt_peel(const float *d, Py_ssize_t n) {
    uintptr_t a = (uintptr_t)d;
    Py_ssize_t h = (a & 3) ? 0 : (Py_ssize_t)(((64 - (a & 63)) & 63) >> 2);
    return h < n ? h : n;
}
#define GGOPT_LOOP(expr) { \
    Py_ssize_t i = 0, h_ = ggopt_peel(d, n); \
    for (; i < h_; i++) d[i] = (expr); \
    for (; i < n; i++) d[i] = (expr); \
} break

GGOPT_MULTIVERSION
static void ggopt_binary_vv(int op, float *d, const float *x, const float *y, Py_ssize_t n) {
    switch (op) {
    case GGOPT_ADD: GGOPT_LOOP(x[i] + y[i]);
    case GGOPT_SUB: GGOPT_LOOP(x[i] - y[i]);
    case GGOPT_MUL: GGOPT_LOOP(x[i] * y[i]);
    default: GGOPT_LOOP(x[i] / y[i]);
    }
}

/* rows [r0, r1) of dense (rows, n) arrays: d = x op y, y one row of n shared by all */
GGOPT_MULTIVERSION
static void ggopt_binary_rows(int op, float *dd, const float *xx, const float *y,
                              Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t n) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        float *d = dd + r * n;
        const float *x = xx + r * n;
        switch (op) {
        case GGOPT_ADD: GGOPT_LOOP(x[i] + y[i]);
        case GGOPT_SUB: GGOPT_LOOP(x[i] - y[i]);
        case GGOPT_MUL: GGOPT_LOOP(x[i] * y[i]);
        default: GGOPT_LOOP(x[i] / y[i]);
        }
    }
}

GGOPT_MULTIVERSION
static void ggopt_binary_vs(int op, float *d, const float *x, float c, Py_ssize_t n) {
    switch (op) {
    case GGOPT_ADD: GGOPT_LOOP(x[i] + c);
    case GGOPT_SUB: GGOPT_LOOP(x[i] - c);
    case GGOPT_MUL: GGOPT_LOOP(x[i] * c);
    default: GGOPT_LOOP(x[i] / c);
    }
}

GGOPT_MULTIVERSION
static void ggopt_unary_v(int uop, float *d, const float *x, Py_ssize_t n) {
    switch (uop) {
    case GGOPT_NEG: GGOPT_LOOP(-x[i]);
    case GGOPT_EXP: GGOPT_LOOP(ggopt_expf(x[i]));
    case GGOPT_LOG: GGOPT_LOOP(logf(x[i]));
    case GGOPT_SQR: GGOPT_LOOP(x[i] * x[i]);
    case GGOPT_SQRT: GGOPT_LOOP(sqrtf(x[i]));
    case GGOPT_RELU: GGOPT_LOOP(ggopt_relu(x[i]));
    case GGOPT_GELU: GGOPT_LOOP(ggopt_gelu(x[i]));
    case GGOPT_SILU: GGOPT_LOOP(ggopt_silu(x[i]));
    case GGOPT_TANH: GGOPT_LOOP(tanhf(x[i]));
    case GGOPT_SIGMOID: GGOPT_LOOP(ggopt_sigmoidf(x[i]));
    case GGOPT_STEP: GGOPT_LOOP(ggopt_step(x[i]));
    default: GGOPT_LOOP(fabsf(x[i]));
    }
}

GGOPT_MULTIVERSION
static void ggopt_unary_back_v(int uop, float *d, const float *x, const float *g,
                               Py_ssize_t n) {
    switch (uop) {
    case GGOPT_NEG: GGOPT_LOOP(-g[i]);
    case GGOPT_EXP: GGOPT_LOOP(g[i] * ggopt_expf(x[i]));
    case GGOPT_LOG: GGOPT_LOOP(g[i] / x[i]);
    case GGOPT_SQR: GGOPT_LOOP(g[i] * (2.0f * x[i]));
    case GGOPT_SQRT: GGOPT_LOOP(g[i] / (2.0f * sqrtf(x[i])));
    case GGOPT_RELU: GGOPT_LOOP(g[i] * ggopt_step(x[i]));
    case GGOPT_GELU: GGOPT_LOOP(g[i] * ggopt_gelu_d(x[i]));
    case GGOPT_SILU: GGOPT_LOOP(g[i] * ggopt_silu_d(x[i]));
    case GGOPT_TANH: GGOPT_LOOP(g[i] * ggopt_tanh_d(x[i]));
    case GGOPT_SIGMOID: GGOPT_LOOP(g[i] * ggopt_sigmoid_d(x[i]));
    default: GGOPT_LOOP(g[i] * ggopt_sgn(x[i]));
    }
}

GGOPT_MULTIVERSION
static void ggopt_scale_v(float *d, const float *x, Py_ssize_t n, float s, float b) {
    Py_ssize_t i = 0, h = ggopt_peel(d, n);
    for (; i < h; i++) d[i] = s * x[i] + b;
    for (; i < n; i++) d[i] = s * x[i] + b;
}

#endif
