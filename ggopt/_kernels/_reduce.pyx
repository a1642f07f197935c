"""Reductions and tiling: sum_rows, sum_all, repeat, repeat_back, argmax, count_equal.

4-D arrays are in NumPy order ``(ne3, ne2, ne1, ne0)`` with any byte strides. Sums accumulate
in double like ggml's ``ggml_float``.
"""

from cython.parallel cimport prange
from libc.math cimport INFINITY
from libc.stdint cimport int32_t
from libc.string cimport memmove

from ggopt._kernels._common cimport (
    check_n_threads,
    Arr4,
    arr4_c_contig,
    arr4_flatten,
    arr4_same_shape,
    arr4_set,
    arr4_shape_str,
    arr4_size,
    drive_elements,
    tile_index,
)

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

cdef extern from *:
    """
    #include <string.h>

    typedef float ggopt_f8 __attribute__((vector_size(32)));
    typedef int32_t ggopt_i8 __attribute__((vector_size(32)));

    /* ggml_vec_argmax_f32 of a contiguous row without NaN: the running maximum only grows,
       so the last index at which x equals it is the last index of the row's maximum. Eight
       lanes keep the maximum of their elements and the last index reaching it (selects and
       compares only, exact); then the lanes are merged. -1 when the row holds a NaN (the
       caller runs the sequential definition then). */
    GGOPT_MULTIVERSION
    static int32_t ggopt_argmax_no_nan(const float *x, Py_ssize_t n) {
        ggopt_f8 m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                      -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        ggopt_i8 at = {0, 0, 0, 0, 0, 0, 0, 0}, bad = {0, 0, 0, 0, 0, 0, 0, 0};
        ggopt_i8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) {
            ggopt_f8 v;
            memcpy(&v, x + i, sizeof v);
            ggopt_i8 ge = v >= m;
            m = (ggopt_f8)((ge & (ggopt_i8)v) | (~ge & (ggopt_i8)m));
            at = (ge & (lane + (int32_t)i)) | (~ge & at);
            bad |= v != v;
        }
        float mt = -INFINITY;
        int32_t best = -1;
        int nan = 0;
        for (; i < n; i++) {
            float v = x[i];
            nan |= v != v;
            if (v >= mt) {
                mt = v;
                best = (int32_t)i;
            }
        }
        for (int k = 0; k < 8; k++) nan |= bad[k] != 0;
        if (nan) return -1;
        float top = mt;
        for (int k = 0; k < 8; k++) top = top > m[k] ? top : m[k];
        if (mt != top) best = -1;
        for (int k = 0; k < 8; k++)
            if (m[k] == top && at[k] > best) best = at[k];
        return best;
    }
    """
    int32_t ggopt_argmax_no_nan(const float *x, Py_ssize_t n) noexcept nogil

# Below this many elements a kernel stays on one thread.
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)


cdef struct Pair:
    Arr4 src
    Arr4 dst


cdef inline const char *_row(const Arr4 *a, Py_ssize_t i3, Py_ssize_t i2,
                             Py_ssize_t i1) noexcept nogil:
    return a.data + i3 * a.s[0] + i2 * a.s[1] + i1 * a.s[2]


cdef inline double _sum_f32(const char *p, Py_ssize_t s, Py_ssize_t n) noexcept nogil:
    """Sum of n floats at byte stride s, in double (four partial sums when contiguous)."""
    cdef const float *f = <const float *>p
    cdef double a0 = 0, a1 = 0, a2 = 0, a3 = 0
    cdef Py_ssize_t i = 0
    if s != 4:
        for i in range(n):
            a0 += (<const float *>(p + i * s))[0]
        return a0
    while i + 4 <= n:
        a0 += f[i]
        a1 += f[i + 1]
        a2 += f[i + 2]
        a3 += f[i + 3]
        i += 4
    while i < n:
        a0 += f[i]
        i += 1
    return (a0 + a1) + (a2 + a3)


cdef str _mismatch(str fn, str what, const Arr4 *a, const Arr4 *b):
    return f"{fn}: {what}; got {arr4_shape_str(a)} and {arr4_shape_str(b)}"


# ----------------------------------------------------------------------------------------------
# sums

cdef void _sum_rows_piece(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                          Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    # walks dst (ne0 == 1): one call per row of src
    cdef Pair *p = <Pair *>ctx
    (<float *>_row(&p.dst, i3, i2, i1))[0] = <float>_sum_f32(
        _row(&p.src, i3, i2, i1), p.src.s[3], p.src.n[3]
    )


def sum_rows(const float[:, :, :, :] a not None, float[:, :, :, :] dst not None, int n_threads):
    """``dst[i3, i2, i1, 0] = sum(a[i3, i2, i1, :])`` (ggml_sum_rows), summed in double."""
    check_n_threads("sum_rows", n_threads)
    cdef Pair p
    arr4_set(&p.src, a)
    arr4_set(&p.dst, dst)
    if (p.dst.n[0] != p.src.n[0] or p.dst.n[1] != p.src.n[1] or p.dst.n[2] != p.src.n[2]
            or p.dst.n[3] != 1):
        raise ShapeError(_mismatch("sum_rows (ggml_sum_rows)",
                                   "dst must have a's shape with a last dim of 1", &p.src, &p.dst))
    with nogil:
        drive_elements(p.dst.n, _sum_rows_piece, &p, arr4_size(&p.src) >= _PAR_MIN_WORK,
                       n_threads)


cdef void _sum_piece(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                     Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Arr4 *a = <Arr4 *>ctx
    acc[0] += _sum_f32(_row(a, i3, i2, i1) + c0 * a.s[3], a.s[3], c1 - c0)


def sum_all(const float[:, :, :, :] a not None, int n_threads):
    """Sum of every element (ggml_sum): accumulated in double, returned rounded to float32."""
    check_n_threads("sum_all", n_threads)
    cdef Arr4 x
    cdef double total
    arr4_set(&x, a)
    if arr4_c_contig(&x):
        arr4_flatten(&x)
    with nogil:
        total = drive_elements(x.n, _sum_piece, &x, arr4_size(&x) >= _PAR_MIN_WORK, n_threads)
    return <float>total


# ----------------------------------------------------------------------------------------------
# repeat and its backward

cdef void _repeat_piece(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                        Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Pair *p = <Pair *>ctx
    cdef Py_ssize_t ds = p.dst.s[3], ss = p.src.s[3], ns = p.src.n[3]
    cdef char *d = <char *>_row(&p.dst, i3, i2, i1)
    cdef const char *s = _row(&p.src, tile_index(i3, p.src.n[0], p.dst.n[0]),
                              tile_index(i2, p.src.n[1], p.dst.n[1]),
                              tile_index(i1, p.src.n[2], p.dst.n[2]))
    cdef Py_ssize_t bj, run, i
    while c0 < c1:
        bj = c0 % ns
        run = min(c1 - c0, ns - bj)
        if ds == 4 and ss == 4:
            memmove(d + c0 * 4, s + bj * 4, run * 4)
        else:
            for i in range(run):
                (<float *>(d + (c0 + i) * ds))[0] = (<const float *>(s + (bj + i) * ss))[0]
        c0 += run


cdef void _tiled_pair(Pair *p, const float[:, :, :, :] src, float[:, :, :, :] dst,
                      bint back) except *:
    """Describe src/dst of repeat (src tiles dst) or repeat_back (dst tiles src); flatten both
    when they are the same contiguous shape."""
    cdef int k
    cdef const Arr4 *small = &p.dst if back else &p.src
    cdef const Arr4 *big = &p.src if back else &p.dst
    arr4_set(&p.src, src)
    arr4_set(&p.dst, dst)
    for k in range(4):
        if small.n[k] == 0 or big.n[k] % small.n[k] != 0:
            if back:
                raise ShapeError(_mismatch(
                    "repeat_back (ggml_repeat_back / ggml_can_repeat)",
                    "every dim of dst must divide the matching dim of src", &p.src, &p.dst))
            raise ShapeError(_mismatch(
                "repeat (ggml_repeat / ggml_can_repeat)",
                "every dim of src must divide the matching dim of dst", &p.src, &p.dst))
    if arr4_same_shape(&p.src, &p.dst) and arr4_c_contig(&p.src) and arr4_c_contig(&p.dst):
        arr4_flatten(&p.src)
        arr4_flatten(&p.dst)


def repeat(const float[:, :, :, :] src not None, float[:, :, :, :] dst not None, int n_threads):
    """Tile ``src`` over ``dst`` (ggml_repeat); every dim of src must divide dst's."""
    check_n_threads("repeat", n_threads)
    cdef Pair p
    _tiled_pair(&p, src, dst, False)
    with nogil:
        drive_elements(p.dst.n, _repeat_piece, &p, arr4_size(&p.dst) >= _PAR_MIN_WORK,
                       n_threads)


cdef void _repeat_back_piece(void *ctx, Py_ssize_t j3, Py_ssize_t j2, Py_ssize_t j1,
                             Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    # dst[j, c] = sum over tiles t of src[t*D + j, t0*D0 + c], in float, tiles in ggml's order
    cdef Pair *p = <Pair *>ctx
    cdef Py_ssize_t ds = p.dst.s[3], ss = p.src.s[3], n = c1 - c0
    cdef Py_ssize_t D0 = p.dst.n[3], D1 = p.dst.n[2], D2 = p.dst.n[1], D3 = p.dst.n[0]
    cdef Py_ssize_t t0, t1, t2, t3, i
    cdef bint first = True
    cdef char *d = <char *>_row(&p.dst, j3, j2, j1) + c0 * ds
    cdef float *fd = <float *>d
    cdef const char *s
    cdef const float *fs
    for t3 in range(p.src.n[0] // D3):
        for t2 in range(p.src.n[1] // D2):
            for t1 in range(p.src.n[2] // D1):
                for t0 in range(p.src.n[3] // D0):
                    s = _row(&p.src, t3 * D3 + j3, t2 * D2 + j2, t1 * D1 + j1)
                    s += (t0 * D0 + c0) * ss
                    fs = <const float *>s
                    if ds == 4 and ss == 4:
                        if first:
                            for i in range(n):
                                fd[i] = fs[i]
                        else:
                            for i in range(n):
                                fd[i] += fs[i]
                    elif first:
                        for i in range(n):
                            (<float *>(d + i * ds))[0] = (<const float *>(s + i * ss))[0]
                    else:
                        for i in range(n):
                            (<float *>(d + i * ds))[0] += (<const float *>(s + i * ss))[0]
                    first = False


def repeat_back(const float[:, :, :, :] src not None, float[:, :, :, :] dst not None,
                int n_threads):
    """``dst`` = the sum of ``src`` over all tiles of dst's shape (ggml_repeat_back).

    Every dim of dst must divide src's. dst is overwritten, not accumulated into.
    """
    check_n_threads("repeat_back", n_threads)
    cdef Pair p
    _tiled_pair(&p, src, dst, True)
    if p.dst.n[3] == 1 and p.src.n[3] > 1:
        _repeat_back_rows(&p, n_threads)
        return
    if _repeat_back_one_row(&p, n_threads):
        return
    with nogil:
        drive_elements(p.dst.n, _repeat_back_piece, &p, arr4_size(&p.src) >= _PAR_MIN_WORK,
                       n_threads)


cdef extern from *:
    """
    /* d[i] = r_0[i] + r_1[i] + ... + r_{m-1}[i] for i < n (row r_k at s + k*rs bytes), in float
       and in row order (repeat_back's order), 64 columns at a time kept in registers. */
    GGOPT_MULTIVERSION
    static void ggopt_sum_rows64(float *d, const char *s, Py_ssize_t rs, Py_ssize_t m,
                                 Py_ssize_t n) {
        Py_ssize_t c = 0;
        for (; c + 64 <= n; c += 64) {
            float acc[64];
            const float *r = (const float *)s + c;
            for (int i = 0; i < 64; i++) acc[i] = r[i];
            for (Py_ssize_t k = 1; k < m; k++) {
                r = (const float *)(s + k * rs) + c;
                for (int i = 0; i < 64; i++) acc[i] += r[i];
            }
            for (int i = 0; i < 64; i++) d[c + i] = acc[i];
        }
        for (; c < n; c++) {
            float a = ((const float *)s)[c];
            for (Py_ssize_t k = 1; k < m; k++) a += ((const float *)(s + k * rs))[c];
            d[c] = a;
        }
    }

    /* Sum of n contiguous floats in double, in eight interleaved partial sums (so that it
       vectorizes); built for AVX2 as well (GGOPT_MULTIVERSION). */
    GGOPT_MULTIVERSION
    static double ggopt_sum_f32_contig8(const float *f, Py_ssize_t n) {
        double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) a[k] += f[i + k];
        for (int k = 0; i < n; i++, k++) a[k] += f[i];
        return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    }
    """
    double _sum_f32_contig8 "ggopt_sum_f32_contig8" (const float *f, Py_ssize_t n) noexcept nogil
    void _sum_rows64 "ggopt_sum_rows64" (float *d, const char *s, Py_ssize_t rs, Py_ssize_t m,
                                         Py_ssize_t n) noexcept nogil

# columns per piece of repeat_back into one row (a multiple of the 64 ggopt_sum_rows64 keeps)
cdef Py_ssize_t _ONE_ROW_COLS = 64


cdef bint _repeat_back_one_row(const Pair *p, int n_threads) noexcept:
    """repeat_back of rows into one row of their length (a bias or norm-weight gradient),
    when src's rows are evenly spaced and both have unit column strides: fixed pieces of
    columns, each summed over the rows in order (the bits of the general path, faster).
    False, and nothing done, for other shapes."""
    cdef Py_ssize_t rows = p.src.n[0] * p.src.n[1] * p.src.n[2], n = p.src.n[3], rs = p.src.s[2]
    cdef Py_ssize_t npieces, i, c0
    if p.dst.n[0] != 1 or p.dst.n[1] != 1 or p.dst.n[2] != 1 or p.dst.n[3] != n or rows < 1:
        return False
    if p.src.s[3] != 4 or p.dst.s[3] != 4:
        return False
    if (p.src.n[1] > 1 and p.src.s[1] != p.src.n[2] * rs) or \
            (p.src.n[0] > 1 and p.src.s[0] != p.src.n[1] * p.src.n[2] * rs):
        return False
    npieces = (n + _ONE_ROW_COLS - 1) // _ONE_ROW_COLS
    cdef bint par = n_threads > 1 and npieces > 1 and rows * n >= _PAR_MIN_WORK
    cdef float *d = <float *>p.dst.data
    with nogil:
        if par:
            for i in prange(npieces, num_threads=n_threads, schedule="static"):
                _sum_rows64(d + i * _ONE_ROW_COLS, p.src.data + i * _ONE_ROW_COLS * 4, rs, rows,
                            min(_ONE_ROW_COLS, n - i * _ONE_ROW_COLS))
        else:
            for i in range(npieces):
                c0 = i * _ONE_ROW_COLS
                _sum_rows64(d + c0, p.src.data + c0 * 4, rs, rows, min(_ONE_ROW_COLS, n - c0))
    return True

# repeat_back into ne0 == 1 sums src in at most this many groups of its outermost index
cdef Py_ssize_t _ROWS_GROUPS = 32


cdef void _repeat_back_rows_group(const Pair *p, Py_ssize_t i3_lo, Py_ssize_t i3_hi,
                                  double *acc) noexcept nogil:
    """Add rows ``i3`` in ``[i3_lo, i3_hi)`` of src to ``acc`` (D3, D2, D1), in memory order;
    with D1 == 1 and contiguous planes, a whole (i3, i2) plane at a time."""
    cdef Py_ssize_t D3 = p.dst.n[0], D2 = p.dst.n[1], D1 = p.dst.n[2]
    cdef Py_ssize_t n1 = p.src.n[2], n0 = p.src.n[3]
    cdef bint planes = D1 == 1 and p.src.s[3] == 4 and (n1 == 1 or p.src.s[2] == 4 * n0)
    cdef Py_ssize_t i3, i2, i1
    cdef double* a
    for i3 in range(i3_lo, i3_hi):
        for i2 in range(p.src.n[1]):
            a = acc + ((i3 % D3) * D2 + i2 % D2) * D1
            if planes:
                a[0] += _sum_f32_contig8(<const float *>_row(&p.src, i3, i2, 0), n1 * n0)
            else:
                for i1 in range(n1):
                    a[i1 % D1] += _sum_f32(_row(&p.src, i3, i2, i1), p.src.s[3], n0)


cdef void _repeat_back_rows(Pair *p, int n_threads) except *:
    """repeat_back into a dst with ne0 == 1 (e.g. a conv bias gradient): src's rows summed in
    double, in fixed groups of its outermost index (set by the shape), each into its own
    partial; the partials are added in group order, so no result depends on n_threads."""
    import numpy as np
    cdef Py_ssize_t D3 = p.dst.n[0], D2 = p.dst.n[1], D1 = p.dst.n[2]
    cdef Py_ssize_t S3 = p.src.n[0], nacc = D3 * D2 * D1
    cdef Py_ssize_t ngroups = max(1, min(S3, _ROWS_GROUPS))
    cdef double[:, ::1] part = np.zeros((ngroups, nacc), dtype=np.float64)
    cdef double* pb = &part[0, 0]
    cdef Py_ssize_t grp, e, i3, i2, i1
    cdef bint par = n_threads > 1 and ngroups > 1 and arr4_size(&p.src) >= _PAR_MIN_WORK
    with nogil:
        if par:
            for grp in prange(ngroups, num_threads=n_threads, schedule="static"):
                _repeat_back_rows_group(p, S3 * grp // ngroups, S3 * (grp + 1) // ngroups,
                                        pb + grp * nacc)
        else:
            for grp in range(ngroups):
                _repeat_back_rows_group(p, S3 * grp // ngroups, S3 * (grp + 1) // ngroups,
                                        pb + grp * nacc)
        for grp in range(1, ngroups):
            for e in range(nacc):
                pb[e] += pb[grp * nacc + e]
        for i3 in range(D3):
            for i2 in range(D2):
                for i1 in range(D1):
                    (<float *>_row(&p.dst, i3, i2, i1))[0] = <float>pb[(i3 * D2 + i2) * D1 + i1]


# ----------------------------------------------------------------------------------------------
# argmax and count_equal

cdef inline int32_t _argmax_row(const char *p, Py_ssize_t s, Py_ssize_t n) noexcept nogil:
    # ggml_vec_argmax_f32: the last index at which x equals the running maximum
    cdef float m = -INFINITY, v
    cdef int32_t idx = 0
    cdef Py_ssize_t i
    if s == 4 and n >= 16:  # short rows (10 classes): the sequential definition is quicker
        idx = ggopt_argmax_no_nan(<const float *>p, n)
        if idx >= 0:
            return idx
        idx = 0
    for i in range(n):
        v = (<const float *>(p + i * s))[0]
        m = m if m > v else v
        if m == v:
            idx = <int32_t>i
    return idx


def argmax(const float[:, :] a not None, int32_t[:] dst not None, int n_threads):
    """``dst[r]`` = index of the maximum of row ``a[r]`` (ggml_argmax); ties give the last index."""
    check_n_threads("argmax", n_threads)
    cdef Py_ssize_t nrows = a.shape[0], ncols = a.shape[1], r
    cdef Py_ssize_t s0 = a.strides[0], s1 = a.strides[1]
    cdef const char *base
    if dst.shape[0] != nrows:
        raise ShapeError(f"argmax (ggml_argmax): dst must have one entry per row of a "
                         f"({nrows}), got {dst.shape[0]}")
    if nrows == 0:
        return
    if ncols == 0:
        raise ShapeError("argmax (ggml_argmax): a has no columns")
    base = <const char *>&a[0, 0]
    if n_threads < 2 or nrows * ncols < _PAR_MIN_WORK:  # no OpenMP region (see drive_elements)
        with nogil:
            for r in range(nrows):
                dst[r] = _argmax_row(base + r * s0, s1, ncols)
        return
    for r in prange(nrows, nogil=True, num_threads=n_threads, schedule="static"):
        dst[r] = _argmax_row(base + r * s0, s1, ncols)


cdef void _count_piece(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                       Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Pair *p = <Pair *>ctx
    cdef const char *a = _row(&p.src, i3, i2, i1)
    cdef const char *b = _row(&p.dst, i3, i2, i1)
    cdef Py_ssize_t sa = p.src.s[3], sb = p.dst.s[3], i, n = 0
    cdef const int32_t *ia = <const int32_t *>a
    cdef const int32_t *ib = <const int32_t *>b
    if sa == 4 and sb == 4:
        for i in range(c0, c1):
            n += ia[i] == ib[i]
    else:
        for i in range(c0, c1):
            n += (<const int32_t *>(a + i * sa))[0] == (<const int32_t *>(b + i * sb))[0]
    acc[0] += n


cdef void _set_i32(Arr4 *x, const int32_t[:, :, :, :] m) noexcept:
    cdef int k
    x.data = <char *>&m[0, 0, 0, 0]
    for k in range(4):
        x.n[k] = m.shape[k]
        x.s[k] = m.strides[k]


def count_equal(const int32_t[:, :, :, :] a not None, const int32_t[:, :, :, :] b not None,
                int n_threads):
    """Number of positions where the int32 arrays a and b are equal (ggml_count_equal)."""
    check_n_threads("count_equal", n_threads)
    cdef Pair p
    cdef double n
    _set_i32(&p.src, a)
    _set_i32(&p.dst, b)
    if not arr4_same_shape(&p.src, &p.dst):
        raise ShapeError(_mismatch("count_equal (ggml_count_equal)",
                                   "a and b must have the same shape", &p.src, &p.dst))
    if arr4_c_contig(&p.src) and arr4_c_contig(&p.dst):
        arr4_flatten(&p.src)
        arr4_flatten(&p.dst)
    with nogil:
        n = drive_elements(p.src.n, _count_piece, &p, arr4_size(&p.src) >= _PAR_MIN_WORK,
                           n_threads)
    return <Py_ssize_t>n
