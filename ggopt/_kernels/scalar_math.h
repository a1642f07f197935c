/* The scalar float32 math of ggopt's ops: one source for the C kernels (the Cython modules
   include this file) and the CUDA kernels (ggopt/backend/cupy_ops prepends it to every
   ElementwiseKernel). The NumPy array backend (backend/xp_ops) is written independently and
   is the test oracle for both.

   GGOPT_FN qualifies every function: "static inline" in C; the CUDA preamble defines it as
   "__device__ __forceinline__" first. GGOPT_EXP_FN is the exponential the functions use: the
   polynomial ggopt_expf below in C (branch-free, so loops vectorize); CUDA's expf on the GPU.
   Everything is float32 in a fixed order of operations, so that each backend's results are
   the same bits for any thread count. */

#ifndef GGOPT_SCALAR_MATH_H
#define GGOPT_SCALAR_MATH_H

#ifndef GGOPT_FN
#define GGOPT_FN static inline
#endif

#ifndef __CUDACC_RTC__
#include <math.h>
#include <stdint.h>

/* exp(x) in float32, within about 2 ulp of the correctly rounded result.
   exp(x) = 2^n * exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2; exp(r) is Cephes'
   polynomial. 2^n is applied as two factors so that n from -150 to 129 never leaves the
   normal exponent range: large x overflow to +inf, very negative x underflow to 0, NaN stays
   NaN. Branch-free, so loops over it vectorize: the clamps (to 89 and -104, NaN passing) and
   the NaN test are bit masks, not selects, which GCC threaded through the rest of the function
   and vectorized both ways of (twice the work; the same bits for every input either way). */
GGOPT_FN float ggopt_expf(float x) {
    union { float f; int32_t i; } s1, s2, c, tz;
    int32_t hi = -(int32_t)(x > 89.0f), lo = -(int32_t)(x < -104.0f);
    c.f = x;
    c.i = (c.i & ~(hi | lo)) | (0x42b20000 & hi) | (-0x3d300000 & lo);  /* 89, -104 (0xc2d00000) */
    float xc = c.f;
    float t = xc * 1.44269504088896341f;
    tz.f = t;
    tz.i &= -(int32_t)(t == t);  /* NaN -> +0 */
    t = tz.f;
    float fn = (t + 12582912.0f) - 12582912.0f;
    float r = xc - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    int32_t n = (int32_t)fn;
    int32_t n1 = n >> 1;
    s1.i = (n1 + 127) << 23;
    s2.i = (n - n1 + 127) << 23;
    return p * s1.f * s2.f;
}
#endif

#ifndef GGOPT_EXP_FN
#define GGOPT_EXP_FN ggopt_expf
#endif

/* sqrt(2/pi) and the cubic coefficient of ggml's tanh-approximated GELU */
#define GGOPT_GELU_K 0.79788456080286535587989211986876f
#define GGOPT_GELU_A 0.044715f

/* --- unary functions f(x) ------------------------------------------------------------------ */

/* 1 / (1 + exp(-x)); 0 for x below about -88, 1 for large x. */
GGOPT_FN float ggopt_sigmoidf(float x) { return 1.0f / (1.0f + GGOPT_EXP_FN(-x)); }
GGOPT_FN float ggopt_step(float x) { return x > 0.0f ? 1.0f : 0.0f; }
GGOPT_FN float ggopt_relu(float x) { return x > 0.0f ? x : 0.0f; }
GGOPT_FN float ggopt_sgn(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }
GGOPT_FN float ggopt_silu(float x) { return x * ggopt_sigmoidf(x); }

/* 0.5*x*(1 + tanh(u)), u = k*x*(1 + a*x^2), computed as x*sigmoid(2u) (the same function,
   without tanh, so that it vectorizes and does not cancel for x << 0) */
GGOPT_FN float ggopt_gelu(float x) {
    float u = GGOPT_GELU_K * x * (1.0f + GGOPT_GELU_A * x * x);
    return x * ggopt_sigmoidf(2.0f * u);
}

/* --- derivatives f'(x); the backward pass multiplies them by the incoming gradient --------- */

/* d/dx of ggopt_gelu: 0.5*(1 + t) + 0.5*x*(1 - t^2)*u' with t = tanh(u); with s =
   sigmoid(2u), 1 + t = 2s and 1 - t^2 = 4s(1 - s) */
GGOPT_FN float ggopt_gelu_d(float x) {
    float u = GGOPT_GELU_K * x * (1.0f + GGOPT_GELU_A * x * x);
    float du = GGOPT_GELU_K * (1.0f + 3.0f * GGOPT_GELU_A * x * x);
    float s = ggopt_sigmoidf(2.0f * u);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

GGOPT_FN float ggopt_silu_d(float x) {
    float s = ggopt_sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}

GGOPT_FN float ggopt_sigmoid_d(float x) {
    float s = ggopt_sigmoidf(x);
    return s * (1.0f - s);
}

GGOPT_FN float ggopt_tanh_d(float x) {
    float t = tanhf(x);
    return 1.0f - t * t;
}

/* --- optimizer updates of one parameter (spec section 2.10) --------------------------------- */

/* ggml_opt_step_adamw for one element, in ggml's order of operations: keep = 1 - alpha*wd,
   b1h = 1/(1 - beta1^t), b2h = 1/(1 - beta2^t). Updates *m and *v and returns the new w. */
GGOPT_FN float ggopt_adamw1(float w, float g, float *m, float *v, float alpha, float b1,
                            float b2, float eps, float keep, float b1h, float b2h) {
    float mi = *m * b1 + g * (1.0f - b1);
    float vi = *v * b2 + g * g * (1.0f - b2);
    *m = mi;
    *v = vi;
    float mh = mi * b1h;
    float vh = sqrtf(vi * b2h) + eps;
    return w * keep - alpha * mh / vh;
}

/* ggml_opt_step_sgd for one element: w*keep - alpha*g, keep = 1 - alpha*wd */
GGOPT_FN float ggopt_sgd1(float w, float g, float alpha, float keep) {
    return w * keep - alpha * g;
}

#endif /* GGOPT_SCALAR_MATH_H */
