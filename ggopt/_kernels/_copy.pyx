"""Strided copies between arrays of one element type: ggml's cont, dup and same-type cpy.

Both arrays are 4-D in NumPy order with any byte strides. Rows (the last axis) are split into
one range per thread and copied with ``memcpy`` when both rows are contiguous. A transposed
pair (the source contiguous along the second-to-last axis, the destination along the last:
``cont`` of a transpose) is copied in tiles of 16 x 16 elements, so that both sides read and
write whole cache lines instead of one element per line.
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
# Tile edge (elements) of the transposed copy.
cdef enum:
    _TILE = 16


cdef struct Copy:
    Py_ssize_t n[4]
    Py_ssize_t ss[4]
    Py_ssize_t ds[4]
    Py_ssize_t item
    const char *s0
    char *d0


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


cdef void _rows(const Copy *c, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """Rows ``r0 .. r1-1`` of the flattened (n0, n1, n2) index."""
    cdef Py_ssize_t n1 = c.n[1], n2 = c.n[2]
    cdef Py_ssize_t i1 = r0 % n2, i2 = (r0 // n2) % n1, i3 = r0 // (n2 * n1)
    cdef Py_ssize_t _r
    for _r in range(r0, r1):
        _copy_row(c.d0 + i3 * c.ds[0] + i2 * c.ds[1] + i1 * c.ds[2], c.ds[3],
                  c.s0 + i3 * c.ss[0] + i2 * c.ss[1] + i1 * c.ss[2], c.ss[3], c.n[3], c.item)
        i1 += 1
        if i1 == n2:
            i1 = 0
            i2 += 1
            if i2 == n1:
                i2 = 0
                i3 += 1


cdef void _tiles(const Copy *c, Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    """Planes ``p0 .. p1-1`` of the flattened (n0, n1) index, 4-byte elements, the source
    contiguous along axis 2 and the destination along axis 3: 16 x 16 tiles."""
    cdef Py_ssize_t n2 = c.n[2], n3 = c.n[3], s3 = c.ss[3], d2 = c.ds[2]
    cdef Py_ssize_t p, a, b, i, j, ie, je
    cdef const char *sp
    cdef char *dp
    for p in range(p0, p1):
        sp = c.s0 + (p // c.n[1]) * c.ss[0] + (p % c.n[1]) * c.ss[1]
        dp = c.d0 + (p // c.n[1]) * c.ds[0] + (p % c.n[1]) * c.ds[1]
        a = 0
        while a < n2:
            ie = min(a + _TILE, n2)
            b = 0
            while b < n3:
                je = min(b + _TILE, n3)
                for j in range(b, je):
                    for i in range(a, ie):
                        (<int32_t *>(dp + i * d2 + j * 4))[0] = \
                            (<const int32_t *>(sp + i * 4 + j * s3))[0]
                b = je
            a = ie


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
            raise ShapeError(f"copy: shapes differ ({(<object>src).shape} -> "
                             f"{(<object>dst).shape})")
        ss[k] = src.strides[k]
        ds[k] = dst.strides[k]
    cdef Copy c
    for k in range(4):
        c.n[k], c.ss[k], c.ds[k] = n[k], ss[k], ds[k]
    c.item = src.itemsize
    c.s0 = <const char *>cnp.PyArray_DATA(src)
    c.d0 = <char *>cnp.PyArray_DATA(dst)
    cdef Py_ssize_t rows = n[0] * n[1] * n[2], planes = n[0] * n[1]
    cdef Py_ssize_t nt = n_threads, t
    if rows == 0 or n[3] == 0:
        return
    if n_threads < 2 or rows * n[3] * c.item < _PAR_MIN_BYTES:
        nt = 1
    if c.item == 4 and ss[2] == 4 and ds[3] == 4 and ss[3] != 4 and n[2] > 1:
        nt = min(nt, planes)
        if nt == 1:
            with nogil:
                _tiles(&c, 0, planes)
            return
        for t in prange(nt, nogil=True, num_threads=nt, schedule="static"):
            _tiles(&c, planes * t // nt, planes * (t + 1) // nt)
        return
    if nt == 1:
        with nogil:
            _rows(&c, 0, rows)
        return
    for t in prange(nt, nogil=True, num_threads=nt, schedule="static"):
        _rows(&c, rows * t // nt, rows * (t + 1) // nt)
