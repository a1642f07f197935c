"""Strided copies between arrays of one element type: ggml's cont, dup and same-type cpy.

Both arrays are 4-D in NumPy order with any byte strides; rows (the last axis) are copied in
parallel, with ``memcpy`` when both rows are contiguous.
"""

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int16_t, int32_t, int64_t
from libc.string cimport memcpy
from ggopt._kernels._common cimport check_n_threads

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import DTypeError, ShapeError

cnp.import_array()

# Below this many bytes a copy stays on one thread.
cdef Py_ssize_t _PAR_MIN_BYTES = min_parallel_work(1 << 15)


cdef inline void _copy_row(char *d, Py_ssize_t ds, const char *s, Py_ssize_t ss, Py_ssize_t n,
                           Py_ssize_t item) noexcept nogil:
    cdef Py_ssize_t i
    if ds == item and ss == item:
        memcpy(d, s, n * item)
    elif item == 4:
        for i in range(n):
            (<int32_t *>(d + i * ds))[0] = (<const int32_t *>(s + i * ss))[0]
    elif item == 8:
        for i in range(n):
            (<int64_t *>(d + i * ds))[0] = (<const int64_t *>(s + i * ss))[0]
    elif item == 2:
        for i in range(n):
            (<int16_t *>(d + i * ds))[0] = (<const int16_t *>(s + i * ss))[0]
    else:
        for i in range(n):
            memcpy(d + i * ds, s + i * ss, item)


def copy(cnp.ndarray src not None, cnp.ndarray dst not None, int n_threads):
    """Copy ``src`` into ``dst``: 4-D arrays of one shape and dtype, any strides, no overlap."""
    check_n_threads("copy", n_threads)
    if src.ndim != 4 or dst.ndim != 4:
        raise ShapeError(f"copy: expected 4-D arrays, got {src.ndim}-D and {dst.ndim}-D")
    if src.dtype != dst.dtype:
        raise DTypeError(f"copy: dtypes differ ({src.dtype} -> {dst.dtype})")
    cdef Py_ssize_t k
    cdef Py_ssize_t n[4]
    cdef Py_ssize_t ss[4]
    cdef Py_ssize_t ds[4]
    for k in range(4):
        n[k] = src.shape[k]
        if dst.shape[k] != n[k]:
            raise ShapeError(f"copy: shapes differ ({(<object>src).shape} -> {(<object>dst).shape})")
        ss[k] = src.strides[k]
        ds[k] = dst.strides[k]
    cdef Py_ssize_t item = src.itemsize
    cdef Py_ssize_t rows = n[0] * n[1] * n[2]
    cdef const char *s0 = <const char *>cnp.PyArray_DATA(src)
    cdef char *d0 = <char *>cnp.PyArray_DATA(dst)
    cdef Py_ssize_t r, i1, i2, i3
    if rows == 0 or n[3] == 0:
        return
    with nogil:
        for r in prange(rows, schedule="static", num_threads=n_threads,
                        use_threads_if=n_threads > 1 and rows * n[3] * item >= _PAR_MIN_BYTES):
            i1 = r % n[2]
            i2 = (r // n[2]) % n[1]
            i3 = r // (n[2] * n[1])
            _copy_row(d0 + i3 * ds[0] + i2 * ds[1] + i1 * ds[2], ds[3],
                      s0 + i3 * ss[0] + i2 * ss[1] + i1 * ss[2], ss[3], n[3], item)
