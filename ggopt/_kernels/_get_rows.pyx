"""Row gather and its gradient: get_rows, get_rows_back.

float32 rows, int32 indices. Inputs may have any byte strides; outputs are C-contiguous and are
never allocated here. Shapes, the thread count and every index are checked before anything is
written (ShapeError / InvalidValueError), so no argument makes a kernel read or write out of
bounds.
"""

from cython.parallel cimport prange
from libc.stdint cimport int32_t
from libc.string cimport memcpy, memset

from ggopt._kernels._common cimport check_n_threads, check_shape

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

# Below this many copied elements a kernel runs on the calling thread only.
cdef Py_ssize_t MIN_PARALLEL_WORK = min_parallel_work(1 << 12)
# Column blocks of get_rows_back are multiples of this many floats (a 64-byte cache line), to
# limit false sharing between the threads that write neighbouring blocks of a dst row.
cdef Py_ssize_t COL_ALIGN = 16


cdef Py_ssize_t _first_bad_index(const char* ib, Py_ssize_t I2, Py_ssize_t I1, Py_ssize_t I0,
                                 Py_ssize_t is2, Py_ssize_t is1, Py_ssize_t is0,
                                 Py_ssize_t nrows) noexcept nogil:
    """Flat position of the first index outside ``[0, nrows)``, or -1 when all are inside."""
    cdef Py_ssize_t i2, i1, i0, v
    cdef const char* p
    for i2 in range(I2):
        for i1 in range(I1):
            p = ib + i2 * is2 + i1 * is1
            for i0 in range(I0):
                v = (<const int32_t*>(p + i0 * is0))[0]
                if v < 0 or v >= nrows:
                    return (i2 * I1 + i1) * I0 + i0
    return -1


cdef int _raise_bad_index(str fn, const char* ib, Py_ssize_t I1, Py_ssize_t I0,
                          Py_ssize_t is2, Py_ssize_t is1, Py_ssize_t is0, Py_ssize_t nrows,
                          Py_ssize_t bad, bint one_d) except -1:
    """ShapeError naming the index at flat position ``bad`` (from :func:`_first_bad_index`)."""
    cdef Py_ssize_t i2 = bad // (I1 * I0), i1 = bad // I0 % I1, i0 = bad % I0
    where = f"idx[{i0}]" if one_d else f"idx[{i2}, {i1}, {i0}]"
    raise ShapeError(f"{fn}: {where} = {(<const int32_t*>(ib + i2 * is2 + i1 * is1 + i0 * is0))[0]}"
                     f" is not a row index in [0, {nrows})")


cdef inline void _copy_row(float* d, const char* s, Py_ssize_t n,
                           Py_ssize_t stride) noexcept nogil:
    cdef Py_ssize_t j
    if stride == <Py_ssize_t>sizeof(float):
        memcpy(d, s, n * sizeof(float))
    else:
        for j in range(n):
            d[j] = (<const float*>(s + j * stride))[0]


def get_rows(const float[:, :, :, :] a not None, const int32_t[:, :, :] idx not None,
             float[:, :, :, ::1] dst not None, int n_threads):
    """Gather rows: ``dst[i2, i1, i0, :] = a[i2, i1, idx[i2, i1, i0], :]``.

    Parameters
    ----------
    a : (ne3, ne2, ne1, ne0) float32, any strides
    idx : (ne3, ne2, I0) int32, any strides, every entry in ``[0, ne1)`` (else ShapeError)
    dst : (ne3, ne2, I0, ne0) float32, C-contiguous, overwritten
    n_threads : int

    ggml: ggml_compute_forward_get_rows (F32)
    """
    cdef str fn = "get_rows (ggml_get_rows)"
    cdef Py_ssize_t I2 = idx.shape[0], I1 = idx.shape[1], I0 = idx.shape[2]
    cdef Py_ssize_t ne0 = a.shape[3]
    cdef Py_ssize_t nrows = I2 * I1 * I0, r, i0, i12
    check_n_threads(fn, n_threads)
    check_shape(fn, "idx's leading dims", idx.shape, 2, a.shape[0], a.shape[1])
    check_shape(fn, "dst", dst.shape, 4, I2, I1, I0, ne0)
    if nrows == 0:
        return
    cdef const char* ib = <const char*>&idx[0, 0, 0]
    cdef const char* ab = <const char*>&a[0, 0, 0, 0]
    cdef float* db = &dst[0, 0, 0, 0]
    cdef Py_ssize_t as3 = a.strides[0], as2 = a.strides[1], as1 = a.strides[2]
    cdef Py_ssize_t as0 = a.strides[3]
    cdef Py_ssize_t is2 = idx.strides[0], is1 = idx.strides[1], is0 = idx.strides[2]
    cdef Py_ssize_t bad
    with nogil:  # one GIL release for the index check and the copy
        bad = _first_bad_index(ib, I2, I1, I0, is2, is1, is0, a.shape[2])
        if bad < 0 and ne0 > 0:
            for r in prange(nrows, schedule="static", num_threads=n_threads,
                            use_threads_if=nrows * ne0 >= MIN_PARALLEL_WORK):
                i0 = r % I0
                i12 = r // I0
                _copy_row(
                    db + r * ne0,
                    ab + (i12 // I1) * as3 + (i12 % I1) * as2
                    + (<const int32_t*>(ib + (i12 // I1) * is2 + (i12 % I1) * is1
                                        + i0 * is0))[0] * as1,
                    ne0, as0)
    if bad >= 0:
        _raise_bad_index(fn, ib, I1, I0, is2, is1, is0, a.shape[2], bad, False)


cdef void _scatter_add_cols(const char* gb, Py_ssize_t gs1, Py_ssize_t gs0, const char* ib,
                            Py_ssize_t is0, Py_ssize_t n, float* db, Py_ssize_t nrows,
                            Py_ssize_t ne0, Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
    """Zero columns ``[c0, c1)`` of every dst row, then add each ``g`` row onto its target."""
    cdef Py_ssize_t i, j, row
    cdef float* drow
    cdef const char* grow
    cdef const float* gf
    for row in range(nrows):
        memset(db + row * ne0 + c0, 0, (c1 - c0) * sizeof(float))
    for i in range(n):
        drow = db + (<const int32_t*>(ib + i * is0))[0] * ne0
        grow = gb + i * gs1
        if gs0 == <Py_ssize_t>sizeof(float):
            gf = <const float*>grow
            for j in range(c0, c1):
                drow[j] += gf[j]
        else:
            for j in range(c0, c1):
                drow[j] += (<const float*>(grow + j * gs0))[0]


def get_rows_back(const float[:, :] g not None, const int32_t[:] idx not None,
                  float[:, ::1] dst not None, int n_threads):
    """Scatter-add rows: ``dst[:] = 0`` then ``dst[idx[i], :] += g[i, :]`` for every ``i``.

    Repeated indices accumulate, in order of ``i``. Threads split the columns, so the result
    does not depend on ``n_threads``.

    Parameters
    ----------
    g : (n, ne0) float32, any strides
    idx : (n,) int32, any stride, every entry in ``[0, nrows)`` (else ShapeError)
    dst : (nrows, ne0) float32, C-contiguous, overwritten
    n_threads : int

    ggml: ggml_compute_forward_get_rows_back (F32)
    """
    cdef str fn = "get_rows_back (ggml_get_rows_back)"
    cdef Py_ssize_t n = g.shape[0], ne0 = dst.shape[1], nrows = dst.shape[0]
    check_n_threads(fn, n_threads)
    check_shape(fn, "idx", idx.shape, 1, n)
    check_shape(fn, "g", g.shape, 2, n, ne0)
    if n == 0:
        if nrows * ne0 > 0:
            memset(&dst[0, 0], 0, nrows * ne0 * sizeof(float))
        return
    cdef const char* gb = <const char*>&g[0, 0]
    cdef const char* ib = <const char*>&idx[0]
    cdef float* db = &dst[0, 0]
    cdef Py_ssize_t gs1 = g.strides[0], gs0 = g.strides[1], is0 = idx.strides[0]
    cdef Py_ssize_t nthr = n_threads if n_threads > 1 else 1
    cdef Py_ssize_t width = (ne0 + nthr - 1) // nthr
    width = (width + COL_ALIGN - 1) // COL_ALIGN * COL_ALIGN
    cdef Py_ssize_t nblocks = (ne0 + width - 1) // width if width > 0 else 0, b
    cdef Py_ssize_t bad
    with nogil:  # one GIL release for the index check and the scatter
        bad = _first_bad_index(ib, 1, 1, n, 0, 0, is0, nrows)
        if bad < 0:
            for b in prange(nblocks, schedule="static", num_threads=n_threads,
                            use_threads_if=(n + nrows) * ne0 >= MIN_PARALLEL_WORK):
                _scatter_add_cols(gb, gs1, gs0, ib, is0, n, db, nrows, ne0,
                                  b * width, min(ne0, (b + 1) * width))
    if bad >= 0:
        _raise_bad_index(fn, ib, 1, n, 0, 0, is0, nrows, bad, True)
