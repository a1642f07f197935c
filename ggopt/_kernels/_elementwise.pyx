"""Elementwise float32 kernels: binary ops with ggml's tiling broadcast, unary ops and their
derivatives, scale and fill.

Every array is 4-D in NumPy order ``(ne3, ne2, ne1, ne0)`` with any byte strides. ``dst`` may be
the very same memory as an input. The work is split into ``n_threads`` equal ranges of the
flattened element index; a range walks rows and calls a run function on each contiguous piece,
which takes a vectorizable loop when the inner stride is 4 bytes.
"""

from cython.parallel cimport prange
from libc.math cimport fabsf, logf, sqrtf, tanhf

from ggopt._kernels._common cimport (
    Arr4,
    arr4_c_contig,
    arr4_flatten,
    arr4_same_shape,
    arr4_set,
    arr4_shape_str,
    arr4_size,
    ggopt_expf,
    ggopt_sigmoidf,
    tile_index,
)

from ggopt.errors import ShapeError

BIN_ADD = 0
BIN_SUB = 1
BIN_MUL = 2
BIN_DIV = 3

UN_NEG = 0
UN_EXP = 1
UN_LOG = 2
UN_SQR = 3
UN_SQRT = 4
UN_RELU = 5
UN_GELU = 6
UN_SILU = 7
UN_TANH = 8
UN_SIGMOID = 9
UN_STEP = 10
UN_ABS = 11

cdef enum:
    _ADD = 0
    _SUB = 1
    _MUL = 2
    _DIV = 3
    _NBIN = 4

cdef enum:
    _NEG = 0
    _EXP = 1
    _LOG = 2
    _SQR = 3
    _SQRT = 4
    _RELU = 5
    _GELU = 6
    _SILU = 7
    _TANH = 8
    _SIGMOID = 9
    _STEP = 10
    _ABS = 11
    _NUN = 12
    _UN_NONE = -1

cdef enum:
    _K_BIN = 0    # d = un(x op y), y tiled
    _K_UN = 1     # d = un(x)
    _K_UNB = 2    # d = y * un'(x)  (y is the incoming gradient)
    _K_SCALE = 3  # d = s*x + bias
    _K_FILL = 4   # d = s

# Below this many element-operations a kernel stays on one thread (starting the team costs
# more than it saves). Transcendental ops count _HEAVY element-operations per element.
cdef Py_ssize_t _PAR_MIN_WORK = 1 << 15
cdef Py_ssize_t _HEAVY = 8
# Elements per block when a unary op is fused after a binary op (keeps the block in L1).
cdef Py_ssize_t _FUSE_BLOCK = 2048

cdef extern from *:
    """
    /* sqrt(2/pi) and the cubic coefficient of ggml's tanh-approximated GELU */
    #define GGOPT_GELU_K 0.79788456080286535587989211986876f
    #define GGOPT_GELU_A 0.044715f
    """
    const float _GELU_K "GGOPT_GELU_K"
    const float _GELU_A "GGOPT_GELU_A"


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
# scalar functions

cdef inline float _gelu(float x) noexcept nogil:
    # 0.5*x*(1 + tanh(u)) == x * sigmoid(2u): the same function, computed without tanh
    cdef float u = _GELU_K * x * (1 + _GELU_A * x * x)
    return x * ggopt_sigmoidf(2 * u)


cdef inline float _gelu_d(float x) noexcept nogil:
    # d/dx 0.5*x*(1 + tanh(u)) = 0.5*(1 + t) + 0.5*x*(1 - t^2)*u'; with s = sigmoid(2u):
    # 1 + t = 2s and 1 - t^2 = 4s(1 - s)
    cdef float u = _GELU_K * x * (1 + _GELU_A * x * x)
    cdef float du = _GELU_K * (1 + 3 * _GELU_A * x * x)
    cdef float s = ggopt_sigmoidf(2 * u)
    return s + 2 * x * s * (1 - s) * du


cdef inline float _relu(float x) noexcept nogil:
    return x if x > 0 else <float>0


cdef inline float _step(float x) noexcept nogil:
    return <float>1 if x > 0 else <float>0


cdef inline float _sgn(float x) noexcept nogil:
    return <float>1 if x > 0 else (<float>-1 if x < 0 else <float>0)


cdef inline float _un1(int uop, float x) noexcept nogil:
    if uop == _NEG:
        return -x
    elif uop == _EXP:
        return ggopt_expf(x)
    elif uop == _LOG:
        return logf(x)
    elif uop == _SQR:
        return x * x
    elif uop == _SQRT:
        return sqrtf(x)
    elif uop == _RELU:
        return _relu(x)
    elif uop == _GELU:
        return _gelu(x)
    elif uop == _SILU:
        return x * ggopt_sigmoidf(x)
    elif uop == _TANH:
        return tanhf(x)
    elif uop == _SIGMOID:
        return ggopt_sigmoidf(x)
    elif uop == _STEP:
        return _step(x)
    else:
        return fabsf(x)


cdef inline float _unb1(int uop, float x, float g) noexcept nogil:
    """g * f'(x)"""
    cdef float t
    if uop == _NEG:
        return -g
    elif uop == _EXP:
        return g * ggopt_expf(x)
    elif uop == _LOG:
        return g / x
    elif uop == _SQR:
        return g * (2 * x)
    elif uop == _SQRT:
        return g / (2 * sqrtf(x))
    elif uop == _RELU:
        return g if x > 0 else <float>0
    elif uop == _GELU:
        return g * _gelu_d(x)
    elif uop == _SILU:
        t = ggopt_sigmoidf(x)
        return g * (t * (1 + x * (1 - t)))
    elif uop == _TANH:
        t = tanhf(x)
        return g * (1 - t * t)
    elif uop == _SIGMOID:
        t = ggopt_sigmoidf(x)
        return g * (t * (1 - t))
    else:
        return g * _sgn(x)


cdef inline float _bin1(int op, float x, float y) noexcept nogil:
    if op == _ADD:
        return x + y
    elif op == _SUB:
        return x - y
    elif op == _MUL:
        return x * y
    else:
        return x / y


# ----------------------------------------------------------------------------------------------
# runs: n elements of one row, byte strides ds/xs/ys (ys == 0 broadcasts one y value)

cdef void _bin_run(int op, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                   const char *y, Py_ssize_t ys, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef float *fd = <float *>d
    cdef const float *fx = <const float *>x
    cdef const float *fy = <const float *>y
    cdef float c
    if ds == 4 and xs == 4 and ys == 4:
        if op == _ADD:
            for i in range(n):
                fd[i] = fx[i] + fy[i]
        elif op == _SUB:
            for i in range(n):
                fd[i] = fx[i] - fy[i]
        elif op == _MUL:
            for i in range(n):
                fd[i] = fx[i] * fy[i]
        else:
            for i in range(n):
                fd[i] = fx[i] / fy[i]
    elif ds == 4 and xs == 4 and ys == 0:
        c = fy[0]
        if op == _ADD:
            for i in range(n):
                fd[i] = fx[i] + c
        elif op == _SUB:
            for i in range(n):
                fd[i] = fx[i] - c
        elif op == _MUL:
            for i in range(n):
                fd[i] = fx[i] * c
        else:
            for i in range(n):
                fd[i] = fx[i] / c
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = _bin1(
                op, (<const float *>(x + i * xs))[0], (<const float *>(y + i * ys))[0]
            )


cdef void _un_run(int uop, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                  Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef float *fd = <float *>d
    cdef const float *fx = <const float *>x
    if ds != 4 or xs != 4:
        for i in range(n):
            (<float *>(d + i * ds))[0] = _un1(uop, (<const float *>(x + i * xs))[0])
    elif uop == _NEG:
        for i in range(n):
            fd[i] = -fx[i]
    elif uop == _EXP:
        for i in range(n):
            fd[i] = ggopt_expf(fx[i])
    elif uop == _LOG:
        for i in range(n):
            fd[i] = logf(fx[i])
    elif uop == _SQR:
        for i in range(n):
            fd[i] = fx[i] * fx[i]
    elif uop == _SQRT:
        for i in range(n):
            fd[i] = sqrtf(fx[i])
    elif uop == _RELU:
        for i in range(n):
            fd[i] = _relu(fx[i])
    elif uop == _GELU:
        for i in range(n):
            fd[i] = _gelu(fx[i])
    elif uop == _SILU:
        for i in range(n):
            fd[i] = fx[i] * ggopt_sigmoidf(fx[i])
    elif uop == _TANH:
        for i in range(n):
            fd[i] = tanhf(fx[i])
    elif uop == _SIGMOID:
        for i in range(n):
            fd[i] = ggopt_sigmoidf(fx[i])
    elif uop == _STEP:
        for i in range(n):
            fd[i] = _step(fx[i])
    else:
        for i in range(n):
            fd[i] = fabsf(fx[i])


cdef void _unb_run(int uop, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                   const char *g, Py_ssize_t gs, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef float *fd = <float *>d
    cdef const float *fx = <const float *>x
    cdef const float *fg = <const float *>g
    if ds != 4 or xs != 4 or gs != 4:
        for i in range(n):
            (<float *>(d + i * ds))[0] = _unb1(
                uop, (<const float *>(x + i * xs))[0], (<const float *>(g + i * gs))[0]
            )
    elif uop == _RELU:
        for i in range(n):
            fd[i] = fg[i] if fx[i] > 0 else <float>0
    elif uop == _GELU:
        for i in range(n):
            fd[i] = fg[i] * _gelu_d(fx[i])
    elif uop == _SILU:
        for i in range(n):
            fd[i] = _unb1(_SILU, fx[i], fg[i])
    elif uop == _SIGMOID:
        for i in range(n):
            fd[i] = _unb1(_SIGMOID, fx[i], fg[i])
    elif uop == _EXP:
        for i in range(n):
            fd[i] = fg[i] * ggopt_expf(fx[i])
    else:
        for i in range(n):
            fd[i] = _unb1(uop, fx[i], fg[i])


cdef void _scale_run(float s, float b, char *d, Py_ssize_t ds, const char *x, Py_ssize_t xs,
                     Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef float *fd = <float *>d
    cdef const float *fx = <const float *>x
    if ds == 4 and xs == 4:
        for i in range(n):
            fd[i] = s * fx[i] + b
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = s * (<const float *>(x + i * xs))[0] + b


cdef void _fill_run(float v, char *d, Py_ssize_t ds, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef float *fd = <float *>d
    if ds == 4:
        for i in range(n):
            fd[i] = v
    else:
        for i in range(n):
            (<float *>(d + i * ds))[0] = v


# ----------------------------------------------------------------------------------------------
# row segments and element ranges

cdef void _bin_seg(const Job *j, char *d, const char *x, const char *y,
                   Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
    """Columns [c0, c1) of one row; y is the start of b's row, tiled with period ne0(b)."""
    cdef Py_ssize_t ds = j.d.s[3], xs = j.x.s[3], ys = j.y.s[3], nb = j.y.n[3]
    cdef Py_ssize_t p = c0, q, bj, r, blk
    if nb == 1:
        ys = 0
    while p < c1:
        bj = p % nb
        q = c1 if nb == 1 else p + min(c1 - p, nb - bj)
        if j.uop == _UN_NONE:
            _bin_run(j.op, d + p * ds, ds, x + p * xs, xs, y + bj * ys, ys, q - p)
        else:
            r = p
            while r < q:
                blk = min(q - r, _FUSE_BLOCK)
                _bin_run(j.op, d + r * ds, ds, x + r * xs, xs, y + (bj + r - p) * ys, ys, blk)
                _un_run(j.uop, d + r * ds, ds, d + r * ds, ds, blk)
                r += blk
        p = q


cdef void _run_range(const Job *j, Py_ssize_t e0, Py_ssize_t e1) noexcept nogil:
    """Process flattened elements [e0, e1) of dst."""
    cdef Py_ssize_t n0 = j.d.n[3], n1 = j.d.n[2], n2 = j.d.n[1]
    cdef Py_ssize_t row = e0 // n0, c = e0 - (e0 // n0) * n0, cend
    cdef Py_ssize_t i1 = row % n1, i2 = (row // n1) % n2, i3 = row // (n1 * n2)
    cdef char *pd
    cdef const char *px
    cdef const char *py
    while e0 < e1:
        cend = min(n0, c + (e1 - e0))
        pd = j.d.data + i3 * j.d.s[0] + i2 * j.d.s[1] + i1 * j.d.s[2]
        if j.kind == _K_FILL:
            _fill_run(j.s, pd + c * j.d.s[3], j.d.s[3], cend - c)
        else:
            px = j.x.data + i3 * j.x.s[0] + i2 * j.x.s[1] + i1 * j.x.s[2]
            if j.kind == _K_UN:
                _un_run(j.uop, pd + c * j.d.s[3], j.d.s[3], px + c * j.x.s[3], j.x.s[3],
                        cend - c)
            elif j.kind == _K_SCALE:
                _scale_run(j.s, j.bias, pd + c * j.d.s[3], j.d.s[3], px + c * j.x.s[3],
                           j.x.s[3], cend - c)
            else:
                py = (j.y.data + tile_index(i3, j.y.n[0], j.d.n[0]) * j.y.s[0]
                      + tile_index(i2, j.y.n[1], n2) * j.y.s[1]
                      + tile_index(i1, j.y.n[2], n1) * j.y.s[2])
                if j.kind == _K_BIN:
                    _bin_seg(j, pd, px, py, c, cend)
                else:
                    _unb_run(j.uop, pd + c * j.d.s[3], j.d.s[3], px + c * j.x.s[3], j.x.s[3],
                             py + c * j.y.s[3], j.y.s[3], cend - c)
        e0 += cend - c
        c = 0
        i1 += 1
        if i1 == n1:
            i1 = 0
            i2 += 1
            if i2 == n2:
                i2 = 0
                i3 += 1


cdef void _drive(const Job *j, Py_ssize_t cost, int n_threads) noexcept nogil:
    """Split dst's elements into one equal range per thread (one range if the work is small)."""
    cdef Py_ssize_t total = arr4_size(&j.d)
    cdef bint par = n_threads > 1 and total * cost >= _PAR_MIN_WORK
    cdef Py_ssize_t nr = n_threads if par else 1
    cdef Py_ssize_t k
    if total == 0:
        return
    for k in prange(nr, num_threads=n_threads, use_threads_if=par,
                    schedule="static"):
        _run_range(j, total * k // nr, total * (k + 1) // nr)


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


cdef void _prepare_binary(Job *j, int op, int uop, const float[:, :, :, :] a,
                          const float[:, :, :, :] b, float[:, :, :, :] dst, str fn) except *:
    cdef int k
    if op < 0 or op >= _NBIN:
        raise ShapeError(f"{fn}: unknown binary op code {op}; expected 0..{_NBIN - 1}")
    j.kind = _K_BIN
    j.op = op
    j.uop = uop
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


# ----------------------------------------------------------------------------------------------
# public kernels

def binary(int op, const float[:, :, :, :] a, const float[:, :, :, :] b,
           float[:, :, :, :] dst, int n_threads):
    """``dst = a op b`` with b tiled over a (ggml_add / ggml_sub / ggml_mul / ggml_div).

    ``dst[i3, i2, i1, i0] = a[i3, i2, i1, i0] op b[i3 % B3, i2 % B2, i1 % B1, i0 % B0]``;
    every dim of b must divide a's. ``op`` is one of BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV.
    """
    cdef Job j
    _prepare_binary(&j, op, _UN_NONE, a, b, dst, "binary")
    with nogil:
        _drive(&j, 1, n_threads)


def binary_unary(int op, int uop, const float[:, :, :, :] a, const float[:, :, :, :] b,
                 float[:, :, :, :] dst, int n_threads):
    """``dst = uop(a op b)`` in one pass (for example bias add fused with relu)."""
    cdef Job j
    _check_uop(uop, "binary_unary")
    _prepare_binary(&j, op, uop, a, b, dst, "binary_unary")
    with nogil:
        _drive(&j, 1 + _uop_cost(uop), n_threads)


def unary(int uop, const float[:, :, :, :] a, float[:, :, :, :] dst, int n_threads):
    """``dst = uop(a)`` (ggml_unary and ggml_neg/exp/log/sqr/sqrt/abs/step/relu/gelu/silu/...).

    ``uop`` is one of the UN_* codes. relu and step are 0 at x <= 0; gelu is ggml's tanh
    approximation.
    """
    cdef Job j
    _check_uop(uop, "unary")
    j.kind = _K_UN
    j.uop = uop
    arr4_set(&j.x, a)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.d, "unary", "a", "dst")
    if arr4_c_contig(&j.x) and arr4_c_contig(&j.d):
        arr4_flatten(&j.x)
        arr4_flatten(&j.d)
    with nogil:
        _drive(&j, _uop_cost(uop), n_threads)


def unary_back(int uop, const float[:, :, :, :] x, const float[:, :, :, :] g,
               float[:, :, :, :] dst, int n_threads):
    """``dst = g * uop'(x)``: the backward pass of :func:`unary` (ggml_*_back).

    Defined for every UN_* code except UN_STEP; relu'(0) is 0.
    """
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


def scale(const float[:, :, :, :] a, float[:, :, :, :] dst, float s, float bias,
          int n_threads):
    """``dst = s*a + bias`` (ggml_scale / ggml_scale_bias)."""
    cdef Job j
    j.kind = _K_SCALE
    j.s = s
    j.bias = bias
    arr4_set(&j.x, a)
    arr4_set(&j.d, dst)
    _check_same(&j.x, &j.d, "scale", "a", "dst")
    if arr4_c_contig(&j.x) and arr4_c_contig(&j.d):
        arr4_flatten(&j.x)
        arr4_flatten(&j.d)
    with nogil:
        _drive(&j, 1, n_threads)


def fill(float[:, :, :, :] dst, float value, int n_threads):
    """Set every element of ``dst`` to ``value`` (ggml_set_f32 / ggml_fill)."""
    cdef Job j
    j.kind = _K_FILL
    j.s = value
    arr4_set(&j.d, dst)
    if arr4_c_contig(&j.d):
        arr4_flatten(&j.d)
    with nogil:
        _drive(&j, 1, n_threads)
