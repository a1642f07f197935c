"""Rotary position embedding (ggml_rope_ext) and its gradient (ggml_rope_ext_back).

``x`` is 4-D in NumPy order ``(ne3, ne2, ne1, ne0)``: ``ne0`` the head dimension, ``ne1`` the
heads, ``ne2`` the tokens (one position each). The first ``n_dims`` elements of each row are
rotated in pairs, the rest copied. Pairs are adjacent elements (``i0, i0 + 1``, NORMAL mode,
llama) or the two halves (``i, i + n_dims/2``, NEOX mode). Pair ``i`` turns by

    theta = p * freq_base**(-2i/n_dims) / freq_factor[i]   (then YaRN's mix, see rope_yarn)

computed as ggml does: the power by repeated float32 multiplication, cosf/sinf, the YaRN
ramp over ``corr_dims``, and the magnitude scale ``attn_factor`` (times ``1 + 0.1 ln(1/s)``
when ``ext_factor != 0``). The gradient rotates by ``-theta`` with the same magnitude
(``sin_sign = -1``). The cos/sin table of a position is a function of the position alone: when
the positions span no more values than there are tokens (a batch of sequences repeats them),
the tables of the whole span are built once, split between threads, and each token looks its
table up; otherwise each token builds its own. Tokens are split evenly between threads. Either
way every element is the same float32 expression, so results do not depend on the thread count
or the path. ``dst`` may be ``x``.
"""

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc

from cython.parallel cimport prange
from ggopt._kernels._common cimport check_n_threads

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

cdef extern from *:
    """
    #include <math.h>

    /* ggml_rope_yarn_corr_dim: the dimension whose wavelength spans n_ctx_orig / n_rot turns */
    static float ggopt_rope_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
        return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
    }

    static void ggopt_rope_corr_dims(int n_dims, int n_ctx_orig, float freq_base,
                                     float beta_fast, float beta_slow, float dims[2]) {
        float start = floorf(ggopt_rope_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
        float end = ceilf(ggopt_rope_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
        dims[0] = start > 0 ? start : 0;
        dims[1] = end < n_dims - 1 ? end : n_dims - 1;
    }

    static float ggopt_rope_ramp(float low, float high, Py_ssize_t i0) {
        float den = high - low > 0.001f ? high - low : 0.001f;
        float y = ((float)(i0 / 2) - low) / den;
        y = y > 0 ? y : 0;
        y = y < 1 ? y : 1;
        return 1 - y;
    }

    typedef struct {
        float theta_scale, freq_scale, ext_factor, attn_factor, sin_sign;
        float corr_dims[2];
        int fused; /* ggml order: x0*c - x1*s as fmaf(x0, c, -(x1*s)) (docs/ggml-order.md) */
        Py_ssize_t n_dims;
    } ggopt_rope_t;

    /* cos/sin of every pair of position p into cache[2*i], cache[2*i + 1] (ggml's rope cache;
       ff, the frequency factors, may be NULL). */
    static void ggopt_rope_cache(const ggopt_rope_t *r, float p, const char *ff,
                                 Py_ssize_t ffs, float *cache) {
        float theta = p;
        for (Py_ssize_t i0 = 0; i0 < r->n_dims; i0 += 2) {
            float f = ff ? *(const float *)(ff + (i0 / 2) * ffs) : 1.0f;
            float extrap = theta / f;
            float interp = r->freq_scale * extrap;
            float th = interp, mscale = r->attn_factor;
            if (r->ext_factor != 0.0f) {
                float mix = ggopt_rope_ramp(r->corr_dims[0], r->corr_dims[1], i0) * r->ext_factor;
                th = interp * (1 - mix) + extrap * mix;
                mscale *= 1.0f + 0.1f * logf(1.0f / r->freq_scale);
            }
            cache[i0] = cosf(th) * mscale;
            cache[i0 + 1] = sinf(th) * mscale * r->sin_sign;
            theta *= r->theta_scale;
        }
    }

    #define GGOPT_RX(i) (*(const float *)(x + (i) * xs))
    #define GGOPT_RD(i) (*(float *)(d + (i) * ds))

    /* One row of ne0 elements: rotate the first n_dims, copy the rest. Contiguous rows take
       loops over float pointers that vectorize, with the same operations in the same order.
       NORMAL mode computes the even and the odd results in separate loops (into tmp, 2*half
       floats), then interleaves them: one loop over interleaved pairs would be vectorized by
       GCC 12 as complex multiplication, with fused multiply-adds despite -ffp-contract=off. */
    /* ggml's order (docs/ggml-order.md): each pair as GCC fused it in llama.cpp's AVX2 build;
       the only fused multiply-adds of this module (tests/kernels/test_no_fma.py) */
    __attribute__((noinline)) GGOPT_MULTIVERSION
    static void ggopt_rope_row_fused(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                                     Py_ssize_t ne0, Py_ssize_t n_dims, int neox,
                                     const float *cache) {
        Py_ssize_t half = n_dims / 2;
        for (Py_ssize_t i0 = 0; i0 < n_dims; i0 += 2) {
            float c = cache[i0], s = cache[i0 + 1];
            Py_ssize_t k0 = neox ? i0 / 2 : i0;
            Py_ssize_t k1 = neox ? i0 / 2 + half : i0 + 1;
            float x0 = GGOPT_RX(k0), x1 = GGOPT_RX(k1);
            GGOPT_RD(k0) = fmaf(x0, c, -(x1 * s));
            GGOPT_RD(k1) = fmaf(x0, s, x1 * c);
        }
        for (Py_ssize_t i0 = n_dims; i0 < ne0; i0++) GGOPT_RD(i0) = GGOPT_RX(i0);
    }

    GGOPT_ROW_INLINE void ggopt_rope_row(char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                                         Py_ssize_t ne0, Py_ssize_t n_dims, int neox,
                                         const float *cache, float *tmp, int fused) {
        Py_ssize_t half = n_dims / 2;
        if (fused) {
            ggopt_rope_row_fused(d, ds, x, xs, ne0, n_dims, neox, cache);
            return;
        }
        if (xs == 4 && ds == 4) {
            const float *fx = (const float *)x;
            float *fd = (float *)d;
            if (neox) {
                for (Py_ssize_t i = 0; i < half; i++) {
                    float c = cache[2 * i], s = cache[2 * i + 1];
                    float x0 = fx[i], x1 = fx[i + half];
                    fd[i] = x0 * c - x1 * s;
                    fd[i + half] = x0 * s + x1 * c;
                }
            } else {
                float *ev = tmp, *od = tmp + half;
                for (Py_ssize_t i = 0; i < half; i++)
                    ev[i] = fx[2 * i] * cache[2 * i] - fx[2 * i + 1] * cache[2 * i + 1];
                for (Py_ssize_t i = 0; i < half; i++)
                    od[i] = fx[2 * i] * cache[2 * i + 1] + fx[2 * i + 1] * cache[2 * i];
                for (Py_ssize_t i = 0; i < half; i++) {
                    fd[2 * i] = ev[i];
                    fd[2 * i + 1] = od[i];
                }
            }
            for (Py_ssize_t i0 = n_dims; i0 < ne0; i0++) fd[i0] = fx[i0];
            return;
        }
        for (Py_ssize_t i0 = 0; i0 < n_dims; i0 += 2) {
            float c = cache[i0], s = cache[i0 + 1];
            Py_ssize_t k0 = neox ? i0 / 2 : i0;
            Py_ssize_t k1 = neox ? i0 / 2 + half : i0 + 1;
            float x0 = GGOPT_RX(k0), x1 = GGOPT_RX(k1);
            GGOPT_RD(k0) = x0 * c - x1 * s;
            GGOPT_RD(k1) = x0 * s + x1 * c;
        }
        for (Py_ssize_t i0 = n_dims; i0 < ne0; i0++) GGOPT_RD(i0) = GGOPT_RX(i0);
    }

    /* Tokens t0 .. t1-1 of the flattened (ne3, ne2) index, n1 rows each. With a table, the
       cos/sin of position p are table[(p - pmin) * n_dims ...]; without, they are built into
       scratch per token. scratch: 2 * n_dims floats of this thread. */
    GGOPT_MULTIVERSION
    static void ggopt_rope_tokens(const ggopt_rope_t *r, const char *xb, const Py_ssize_t *xst,
                                  char *db, const Py_ssize_t *dst, const char *pb,
                                  Py_ssize_t ps, const char *ff, Py_ssize_t ffs, Py_ssize_t n2,
                                  Py_ssize_t n1, Py_ssize_t ne0, int neox, Py_ssize_t t0,
                                  Py_ssize_t t1, const float *table, int64_t pmin,
                                  float *scratch) {
        float *tmp = scratch + r->n_dims;
        for (Py_ssize_t t = t0; t < t1; t++) {
            Py_ssize_t i3 = t / n2, i2 = t % n2;
            int32_t p = *(const int32_t *)(pb + i2 * ps);
            const float *cs = scratch;
            if (table) cs = table + ((int64_t)p - pmin) * r->n_dims;
            else ggopt_rope_cache(r, (float)p, ff, ffs, scratch);
            const char *xr = xb + i3 * xst[0] + i2 * xst[1];
            char *dr = db + i3 * dst[0] + i2 * dst[1];
            for (Py_ssize_t i1 = 0; i1 < n1; i1++)
                ggopt_rope_row(dr + i1 * dst[2], dst[3], xr + i1 * xst[2], xst[3], ne0,
                               r->n_dims, neox, cs, tmp, r->fused);
        }
    }
    """
    ctypedef struct ggopt_rope_t:
        float theta_scale, freq_scale, ext_factor, attn_factor, sin_sign
        float corr_dims[2]
        int fused
        Py_ssize_t n_dims
    void ggopt_rope_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                              float beta_slow, float *dims) noexcept nogil
    void ggopt_rope_cache(const ggopt_rope_t *r, float p, const char *ff, Py_ssize_t ffs,
                          float *cache) noexcept nogil
    void ggopt_rope_tokens(const ggopt_rope_t *r, const char *xb, const Py_ssize_t *xst,
                           char *db, const Py_ssize_t *dst, const char *pb, Py_ssize_t ps,
                           const char *ff, Py_ssize_t ffs, Py_ssize_t n2, Py_ssize_t n1,
                           Py_ssize_t ne0, int neox, Py_ssize_t t0, Py_ssize_t t1,
                           const float *table, int64_t pmin, float *scratch) noexcept nogil
    float powf(float, float) noexcept nogil

# Below this many elements a call stays on one thread (a rotated pair costs a few flops and a
# cos/sin per token and pair).
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 14)


cdef void _tables(const ggopt_rope_t *r, const char *ff, Py_ssize_t ffs, int64_t p0,
                  int64_t p1, int64_t pmin, float *table) noexcept nogil:
    """The cos/sin tables of positions ``p0 .. p1-1`` (row ``p - pmin`` of ``table``)."""
    cdef int64_t p
    for p in range(p0, p1):
        ggopt_rope_cache(r, <float><int32_t>p, ff, ffs, table + (p - pmin) * r.n_dims)


def rope(const float[:, :, :, :] x not None, const int32_t[:] pos not None, object freq_factors,
         float[:, :, :, :] dst not None, int n_dims, bint neox, int n_ctx_orig, float freq_base,
         float freq_scale, float ext_factor, float attn_factor, float beta_fast,
         float beta_slow, float sin_sign, int n_threads, bint fused=False):
    """``dst = rope(x)`` (``sin_sign = 1``, ggml_rope_ext) or its gradient (``sin_sign = -1``,
    ggml_rope_ext_back); ``freq_factors`` is None or a float32 vector of ``>= n_dims/2``.
    ``fused``: each pair rotated in ggml's order (``fmaf(x0, c, -(x1*s))``, ``fmaf(x0, s, x1*c)``;
    docs/ggml-order.md)."""
    check_n_threads("rope", n_threads)
    cdef const float[:] ffv
    cdef const char *ff = NULL
    cdef Py_ssize_t ffs = 0
    cdef ggopt_rope_t r
    cdef Py_ssize_t n3 = x.shape[0], n2 = x.shape[1], n1 = x.shape[2], ne0 = x.shape[3]
    cdef Py_ssize_t xst[4]
    cdef Py_ssize_t dst_[4]
    cdef Py_ssize_t k, nt = n_threads, ntok = n3 * n2
    cdef float *cache
    cdef char *xb
    cdef char *db
    xshape = tuple([x.shape[k] for k in range(4)])
    dshape = tuple([dst.shape[k] for k in range(4)])
    if xshape != dshape:
        raise ShapeError(f"rope (ggml_rope_ext): dst {dshape} must have the shape of x {xshape}")
    if pos.shape[0] != n2:
        raise ShapeError(f"rope (ggml_rope_ext): {pos.shape[0]} positions for {n2} tokens")
    if n_dims <= 0 or n_dims % 2 or n_dims > ne0:
        raise ShapeError(f"rope (ggml_rope_ext): n_dims must be even and in [2, {ne0}], "
                         f"got {n_dims}")
    if freq_factors is not None:
        ffv = freq_factors
        if ffv.shape[0] < n_dims // 2:
            raise ShapeError(f"rope (ggml_rope_ext): {ffv.shape[0]} frequency factors, "
                             f"need {n_dims // 2}")
        if ffv.shape[0] > 0:
            ff = <const char *>&ffv[0]
            ffs = ffv.strides[0]
    if ntok * n1 * ne0 == 0:
        return
    r.theta_scale = powf(freq_base, <float>-2.0 / <float>n_dims)
    r.freq_scale = freq_scale
    r.ext_factor = ext_factor
    r.attn_factor = attn_factor
    r.sin_sign = sin_sign
    r.fused = fused
    r.n_dims = n_dims
    ggopt_rope_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, r.corr_dims)
    for k in range(4):
        xst[k] = x.strides[k]
        dst_[k] = dst.strides[k]
    xb = <char *>&x[0, 0, 0, 0]
    db = <char *>&dst[0, 0, 0, 0]
    cdef const char *pb = <const char *>&pos[0]
    cdef Py_ssize_t ps = pos.strides[0]
    cdef int neox_i = neox
    cdef int64_t pmin, pmax, span, pv
    cdef float *table = NULL
    pmin = pmax = (<const int32_t *>pb)[0]
    for k in range(1, n2):
        pv = (<const int32_t *>(pb + k * ps))[0]
        pmin = min(pmin, pv)
        pmax = max(pmax, pv)
    span = pmax - pmin + 1
    if nt < 2 or ntok < 2 or ntok * n1 * ne0 < _PAR_MIN_WORK:
        nt = 1
    # per thread 2*n_dims floats of scratch (a token's table, the row's temporaries); then,
    # when the span is short, one table per position of the span, shared by all tokens
    cdef Py_ssize_t ntab = span * n_dims if span <= ntok else 0
    cache = <float *>malloc((nt * 2 * n_dims + ntab) * sizeof(float))
    if cache == NULL:
        raise MemoryError("rope (ggml_rope_ext): no memory for the cos/sin tables")
    if ntab:
        table = cache + nt * 2 * n_dims
    try:
        if nt == 1:
            with nogil:
                if table != NULL:
                    _tables(&r, ff, ffs, pmin, pmax + 1, pmin, table)
                ggopt_rope_tokens(&r, xb, xst, db, dst_, pb, ps, ff, ffs, n2, n1, ne0, neox_i,
                                  0, ntok, table, pmin, cache)
            return
        if table != NULL:
            for k in prange(nt, nogil=True, num_threads=n_threads, schedule="static"):
                _tables(&r, ff, ffs, pmin + span * k // nt, pmin + span * (k + 1) // nt, pmin,
                        table)
        for k in prange(nt, nogil=True, num_threads=n_threads, schedule="static"):
            ggopt_rope_tokens(&r, xb, xst, db, dst_, pb, ps, ff, ffs, n2, n1, ne0, neox_i,
                              ntok * k // nt, ntok * (k + 1) // nt, table, pmin,
                              cache + k * 2 * n_dims)
    finally:
        free(cache)
