"""Elementwise float32 kernels: binary ops with ggml's tiling broadcast, unary ops and their
derivatives, and scale.

Every array is 4-D in NumPy order ``(ne3, ne2, ne1, ne0)`` with any byte strides. ``dst`` may be
the very same memory as an input. The work is split into ``n_threads`` equal ranges of the
flattened element index; a range walks rows and calls a run function on each piece of a row.
The scalar math is ``scalar_math.h`` (shared with the CUDA kernels); the loops over contiguous
pieces are C (``_elementwise_loops.h``): one vectorized loop per op, built twice (see
GGOPT_MULTIVERSION in _common.pxd).
"""

from cython.parallel cimport prange

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

cdef extern from "_elementwise_loops.h":
    enum:
        _ADD "GGOPT_ADD"
        _SUB "GGOPT_SUB"
        _MUL "GGOPT_MUL"
        _DIV "GGOPT_DIV"
        _NBIN "GGOPT_NBIN"
    enum:
        _NEG "GGOPT_NEG"
        _EXP "GGOPT_EXP"
        _LOG "GGOPT_LOG"
        _SQR "GGOPT_SQR"
        _SQRT "GGOPT_SQRT"
        _RELU "GGOPT_RELU"
        _GELU "GGOPT_GELU"
        _SILU "GGOPT_SILU"
        _TANH "GGOPT_TANH"
        _SIGMOID "GGOPT_SIGMOID"
        _STEP "GGOPT_STEP"
        _ABS "GGOPT_ABS"
        _NUN "GGOPT_NUN"
    float ggopt_binary1(int op, float x, float y) noexcept nogil
    float ggopt_unary1(int uop, float x) noexcept nogil
    float ggopt_unary_back1(int uop, float x, float g) noexcept nogil
    void ggopt_binary_rows(int op, float *dd, const float *xx, const float *y, Py_ssize_t r0,
                           Py_ssize_t r1, Py_ssize_t n) noexcept nogil
    void ggopt_binary_vv(int op, float *d, const float *x, const float *y,
                         Py_ssize_t n) noexcept nogil
    void ggopt_binary_vs(int op, float *d, const float *x, float c, Py_ssize_t n) noexcept nogil
    void ggopt_unary_v(int uop, float *d, const float *x, Py_ssize_t n) noexcept nogil
    void ggopt_unary_back_v(int uop, float *d, const float *x, const float *g,
                            Py_ssize_t n) noexcept nogil
    void ggopt_scale_v(float *d, const float *x, Py_ssize_t n, float s, float b) noexcept nogil

BIN_ADD = _ADD
BIN_SUB = _SUB
BIN_MUL = _MUL
BIN_DIV = _DIV

UN_NEG = _NEG
UN_EXP = _EXP
UN_LOG = _LOG
UN_SQR = _SQR
UN_SQRT = _SQRT
UN_RELU = _RELU
UN_GELU = _GELU
UN_SILU = _SILU
UN_TANH = _TANH
UN_SIGMOID = _SIGMOID
UN_STEP = _STEP
UN_ABS = _ABS

cdef enum:
    _K_BIN = 0    # d = x op y, y tiled
    _K_UN = 1     # d = un(x)
    _K_UNB = 2    # d = y * un'(x)  (y is the incoming gradient)
    _K_SCALE = 3  # d = s*x + bias

# Below this many element-operations a kernel stays on one thread (starting the team costs
# more than it saves). Transcendental ops count _HEAVY element-operations per element.
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)
cdef Py_ssize_t _HEAVY = 8


cdef struct Job:
    int kind
    int op
    int uop
    float s
    float bias
    Arr4 d
    Arr4 x
    Arr4 y


# ----------------------------------------------------------------------------------------------
# runs: n elements of one row at byte strides ds/xs/ys (ys == 0 broadcasts one y value);
# contiguous runs go to the C loops above, others are walked element by element

cdef void _bin_run(int op, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                   const char *y, Py_ssize_t ys, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if ds == 4 and xs == 4 and ys == 4:
        ggopt_binary_vv(op, <float *>d, <const float *>x, <const float *>y, n)
    elif ds == 4 and xs == 4 and ys == 0:
        ggopt_binary_vs(op, <float *>d, <const float *>x, (<const float *>y)[0], n)
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = ggopt_binary1(
                op, (<const float *>(x + i * xs))[0], (<const float *>(y + i * ys))[0]
            )


cdef void _un_run(int uop, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                  Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if ds == 4 and xs == 4:
        ggopt_unary_v(uop, <float *>d, <const float *>x, n)
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = ggopt_unary1(uop, (<const float *>(x + i * xs))[0])


cdef void _unb_run(int uop, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                   const char *g, Py_ssize_t gs, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if ds == 4 and xs == 4 and gs == 4:
        ggopt_unary_back_v(uop, <float *>d, <const float *>x, <const float *>g, n)
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = ggopt_unary_back1(
                uop, (<const float *>(x + i * xs))[0], (<const float *>(g + i * gs))[0]
            )


cdef void _scale_run(float s, float b, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                     Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if ds == 4 and xs == 4:
        ggopt_scale_v(<float *>d, <const float *>x, n, s, b)
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = s * (<const float *>(x + i * xs))[0] + b


# ----------------------------------------------------------------------------------------------
# row segments and element ranges

cdef void _bin_seg(const Job *j, char *d, const char *x, const char *y,
                   Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
    """Columns [c0, c1) of one row; y is the start of b's row, tiled with period ne0(b)."""
    cdef Py_ssize_t ds = j.d.s[3], xs = j.x.s[3], ys = j.y.s[3], nb = j.y.n[3]
    cdef Py_ssize_t p = c0, q, bj
    if nb == 1:
        ys = 0
    while p < c1:
        bj = p % nb
        q = c1 if nb == 1 else p + min(c1 - p, nb - bj)
        _bin_run(j.op, d + p * ds, ds, x + p * xs, xs, y + bj * ys, ys, q - p)
        p = q


cdef void _row_piece(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                     Py_ssize_t c, Py_ssize_t cend, double *acc) noexcept nogil:
    """Columns [c, cend) of dst's row (i3, i2, i1); called by the shared element walker."""
    cdef const Job *j = <const Job *>ctx
    cdef char *pd = j.d.data + i3 * j.d.s[0] + i2 * j.d.s[1] + i1 * j.d.s[2]
    cdef const char *px
    cdef const char *py
    px = j.x.data + i3 * j.x.s[0] + i2 * j.x.s[1] + i1 * j.x.s[2]
    if j.kind == _K_UN:
        _un_run(j.uop, pd + c * j.d.s[3], j.d.s[3], px + c * j.x.s[3], j.x.s[3], cend - c)
    elif j.kind == _K_SCALE:
        _scale_run(j.s, j.bias, pd + c * j.d.s[3], j.d.s[3], px + c * j.x.s[3], j.x.s[3],
                   cend - c)
    else:
        py = (j.y.data + tile_index(i3, j.y.n[0], j.d.n[0]) * j.y.s[0]
              + tile_index(i2, j.y.n[1], j.d.n[1]) * j.y.s[1]
              + tile_index(i1, j.y.n[2], j.d.n[2]) * j.y.s[2])
        if j.kind == _K_BIN:
            _bin_seg(j, pd, px, py, c, cend)
        else:
            _unb_run(j.uop, pd + c * j.d.s[3], j.d.s[3], px + c * j.x.s[3], j.x.s[3],
                     py + c * j.y.s[3], j.y.s[3], cend - c)


cdef void _drive(const Job *j, Py_ssize_t cost, int n_threads) noexcept nogil:
    """Run the job over dst's elements: one equal range per thread when the work is large."""
    drive_elements(j.d.n, _row_piece, <void *>j,
                   n_threads > 1 and arr4_size(&j.d) * cost >= _PAR_MIN_WORK, n_threads)


# ----------------------------------------------------------------------------------------------
# setup helpers

cdef void _check_same(const Arr4 *a, const Arr4 *b, str fn, str an, str bn) except *:
    if not arr4_same_shape(a, b):
        raise ShapeError(
            f"{fn}: {bn} must have the shape of {an} {arr4_shape_str(a)}, "
            f"got {arr4_shape_str(b)}"
        )


cdef void _check_uop(int uop, str fn) except *:
    if uop < 0 or uop >= _NUN:
        raise ShapeError(f"{fn}: unknown unary op code {uop}; expected 0..{_NUN - 1}")


cdef Py_ssize_t _uop_cost(int uop) noexcept nogil:
    if uop == _NEG or uop == _SQR or uop == _RELU or uop == _STEP or uop == _ABS:
        return 1
    return _HEAVY


cdef void _prepare_one(Job *j, int kind, const float[:, :, :, :] a, float[:, :, :, :] dst,
                       str fn) except *:
    """A job reading ``a`` and writing ``dst`` (same shape), flattened when both are dense."""
    j.kind = kind
    arr4_set(&j.x, a)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.d, fn, "a", "dst")
    if arr4_c_contig(&j.x) and arr4_c_contig(&j.d):
        arr4_flatten(&j.x)
        arr4_flatten(&j.d)


cdef void _prepare_binary(Job *j, int op, const float[:, :, :, :] a,
                          const float[:, :, :, :] b, float[:, :, :, :] dst, str fn) except *:
    cdef int k
    if op < 0 or op >= _NBIN:
        raise ShapeError(f"{fn}: unknown binary op code {op}; expected 0..{_NBIN - 1}")
    j.kind = _K_BIN
    j.op = op
    arr4_set(&j.x, a)
    arr4_set(&j.y, b)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.d, fn, "a", "dst")
    for k in range(4):
        if j.y.n[k] == 0 or j.x.n[k] % j.y.n[k] != 0:
            raise ShapeError(
                f"{fn} (ggml_can_repeat): every dim of b must divide the matching dim of a; "
                f"a is {arr4_shape_str(&j.x)}, b is {arr4_shape_str(&j.y)}"
            )
    if (arr4_same_shape(&j.x, &j.y) and arr4_c_contig(&j.x) and arr4_c_contig(&j.y)
            and arr4_c_contig(&j.d)):
        arr4_flatten(&j.x)
        arr4_flatten(&j.y)
        arr4_flatten(&j.d)
    elif j.y.n[2] == 1 and j.y.n[3] == 1 and _rows_contig(&j.x) and _rows_contig(&j.d):
        # b is one value per (i3, i2) plane (a per-channel bias): each plane of a and dst is
        # one run against one b value, not ne1 short rows
        _merge_rows(&j.x)
        _merge_rows(&j.d)


cdef inline bint _rows_contig(const Arr4 *a) noexcept nogil:
    """True when dims 1 and 0 (NumPy's last two) of the float32 array are one dense plane."""
    return (a.n[3] == 1 or a.s[3] == 4) and (a.n[2] == 1 or a.s[2] == 4 * a.n[3])


cdef inline void _merge_rows(Arr4 *a) noexcept nogil:
    """View each dense (i3, i2) plane as one row."""
    a.n[3] *= a.n[2]
    a.n[2] = 1
    a.s[3] = 4


# ----------------------------------------------------------------------------------------------
# public kernels

def binary(int op, const float[:, :, :, :] a not None, const float[:, :, :, :] b not None,
           float[:, :, :, :] dst not None, int n_threads):
    """``dst = a op b`` with b tiled over a (ggml_add / ggml_sub / ggml_mul / ggml_div).

    ``dst[i3, i2, i1, i0] = a[i3, i2, i1, i0] op b[i3 % B3, i2 % B2, i1 % B1, i0 % B0]``;
    every dim of b must divide a's. ``op`` is one of BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV.
    """
    check_n_threads("binary", n_threads)
    cdef Job j
    _prepare_binary(&j, op, a, b, dst, "binary")
    if _one_row_of_b(&j):
        _binary_rows(&j, n_threads)
        return
    with nogil:
        _drive(&j, 1, n_threads)


# rows per piece of _binary_rows
cdef Py_ssize_t _ROWS_PIECE = 16


cdef bint _one_row_of_b(const Job *j) noexcept nogil:
    """True when b is one dense row added to every row of dense a and dst (a bias)."""
    return (j.y.n[0] == 1 and j.y.n[1] == 1 and j.y.n[2] == 1 and j.y.n[3] == j.x.n[3]
            and j.x.n[3] > 1 and arr4_size(&j.x) > j.x.n[3] and j.y.s[3] == 4
            and arr4_c_contig(&j.x) and arr4_c_contig(&j.d))


cdef void _binary_rows(const Job *j, int n_threads) noexcept:
    """:func:`binary` with b one row: pieces of rows, each one C loop (no walk per row)."""
    cdef Py_ssize_t n = j.x.n[3], rows = arr4_size(&j.x) // n
    cdef Py_ssize_t npieces = (rows + _ROWS_PIECE - 1) // _ROWS_PIECE, i
    cdef float *d = <float *>j.d.data
    cdef const float *x = <const float *>j.x.data
    cdef const float *y = <const float *>j.y.data
    cdef bint par = n_threads > 1 and npieces > 1 and rows * n >= _PAR_MIN_WORK
    with nogil:
        if par:
            for i in prange(npieces, num_threads=n_threads, schedule="static"):
                ggopt_binary_rows(j.op, d, x, y, i * _ROWS_PIECE,
                                  min(rows, (i + 1) * _ROWS_PIECE), n)
        else:
            ggopt_binary_rows(j.op, d, x, y, 0, rows, n)


def unary(int uop, const float[:, :, :, :] a not None, float[:, :, :, :] dst not None,
          int n_threads):
    """``dst = uop(a)`` (ggml_unary and ggml_neg/exp/log/sqr/sqrt/abs/step/relu/gelu/silu/...).

    ``uop`` is one of the UN_* codes. relu and step are 0 at x <= 0; gelu is ggml's tanh
    approximation.
    """
    check_n_threads("unary", n_threads)
    cdef Job j
    _check_uop(uop, "unary")
    j.uop = uop
    _prepare_one(&j, _K_UN, a, dst, "unary")
    with nogil:
        _drive(&j, _uop_cost(uop), n_threads)


def unary_back(int uop, const float[:, :, :, :] x not None, const float[:, :, :, :] g not None,
               float[:, :, :, :] dst not None, int n_threads):
    """``dst = g * uop'(x)``: the backward pass of :func:`unary` (ggml_*_back).

    Defined for every UN_* code except UN_STEP; relu'(0) is 0.
    """
    check_n_threads("unary_back", n_threads)
    cdef Job j
    _check_uop(uop, "unary_back")
    if uop == _STEP:
        raise ShapeError("unary_back: UN_STEP has no backward pass (its derivative is 0)")
    j.kind = _K_UNB
    j.uop = uop
    arr4_set(&j.x, x)
    arr4_set(&j.y, g)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.d, "unary_back", "x", "dst")
    _check_same(&j.x, &j.y, "unary_back", "x", "g")
    if arr4_c_contig(&j.x) and arr4_c_contig(&j.y) and arr4_c_contig(&j.d):
        arr4_flatten(&j.x)
        arr4_flatten(&j.y)
        arr4_flatten(&j.d)
    with nogil:
        _drive(&j, _uop_cost(uop), n_threads)


def scale(const float[:, :, :, :] a not None, float[:, :, :, :] dst not None, float s, float bias,
          int n_threads):
    """``dst = s*a + bias`` (ggml_scale / ggml_scale_bias)."""
    check_n_threads("scale", n_threads)
    cdef Job j
    j.s = s
    j.bias = bias
    _prepare_one(&j, _K_SCALE, a, dst, "scale")
    with nogil:
        _drive(&j, 1, n_threads)
