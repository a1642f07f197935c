"""Element-wise kernels of the transformer ops: swiglu (silu(x0) * x1), sin and cos.

Arrays are 4-D in NumPy order with any byte strides and one shape. ``dst`` may be the memory
of an input. The elements are split into equal ranges per thread (``drive_elements``);
contiguous pieces of a row run through vectorizable C loops.
"""

from ggopt._kernels._common cimport (
    check_n_threads,
    Arr4,
    arr4_same_shape,
    arr4_set,
    arr4_shape_str,
    arr4_size,
    drive_elements,
)

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

cdef extern from *:
    """
    enum { GGOPT_PW_SWIGLU, GGOPT_PW_SIN, GGOPT_PW_COS };

    GGOPT_MULTIVERSION
    static void ggopt_swiglu_v(float *d, const float *x, const float *y, Py_ssize_t n) {
        for (Py_ssize_t i = 0; i < n; i++) d[i] = (x[i] * ggopt_sigmoidf(x[i])) * y[i];
    }

    static inline float ggopt_pw1(int op, float x, float y) {
        switch (op) {
        case GGOPT_PW_SWIGLU: return (x * ggopt_sigmoidf(x)) * y;
        case GGOPT_PW_SIN: return sinf(x);
        default: return cosf(x);
        }
    }
    """
    enum:
        _SWIGLU "GGOPT_PW_SWIGLU"
        _SIN "GGOPT_PW_SIN"
        _COS "GGOPT_PW_COS"
    void ggopt_swiglu_v(float *d, const float *x, const float *y, Py_ssize_t n) noexcept nogil
    float ggopt_pw1(int op, float x, float y) noexcept nogil

# Below this many element-operations a kernel stays on one thread; each element of these ops
# costs about _HEAVY of them (an exp, a sin or a cos).
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)
cdef Py_ssize_t _HEAVY = 8


cdef struct Job:
    int op
    Arr4 x
    Arr4 y
    Arr4 d


cdef inline char *_at(const Arr4 *a, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                      Py_ssize_t i0) noexcept nogil:
    return a.data + i3 * a.s[0] + i2 * a.s[1] + i1 * a.s[2] + i0 * a.s[3]


cdef void _piece(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1, Py_ssize_t c0,
                 Py_ssize_t c1, double *acc) noexcept nogil:
    cdef Job *j = <Job *>ctx
    cdef char *d = _at(&j.d, i3, i2, i1, c0)
    cdef const char *x = _at(&j.x, i3, i2, i1, c0)
    cdef const char *y = x
    cdef Py_ssize_t n = c1 - c0, i, ds = j.d.s[3], xs = j.x.s[3], ys = xs
    if j.op == _SWIGLU:
        y = _at(&j.y, i3, i2, i1, c0)
        ys = j.y.s[3]
        if ds == 4 and xs == 4 and ys == 4:
            ggopt_swiglu_v(<float *>d, <const float *>x, <const float *>y, n)
            return
    for i in range(n):
        (<float *>(d + i * ds))[0] = ggopt_pw1(j.op, (<const float *>(x + i * xs))[0],
                                               (<const float *>(y + i * ys))[0])


cdef void _check(const Arr4 *a, const Arr4 *b, str fn, str name) except *:
    if not arr4_same_shape(a, b):
        raise ShapeError(f"{fn}: {name} must have the shape {arr4_shape_str(a)}, "
                         f"got {arr4_shape_str(b)}")


cdef void _run(Job *j, int n_threads) noexcept:
    cdef bint par = n_threads > 1 and arr4_size(&j.d) * _HEAVY >= _PAR_MIN_WORK
    with nogil:
        drive_elements(j.d.n, _piece, j, par, n_threads)


def swiglu(const float[:, :, :, :] x0 not None, const float[:, :, :, :] x1 not None,
           float[:, :, :, :] dst not None, int n_threads):
    """``dst = silu(x0) * x1`` (ggml_swiglu_split; ggml_swiglu passes the halves of a row)."""
    check_n_threads("swiglu", n_threads)
    cdef Job j
    j.op = _SWIGLU
    arr4_set(&j.x, x0)
    arr4_set(&j.y, x1)
    arr4_set(&j.d, dst)
    _check(&j.x, &j.y, "swiglu (ggml_swiglu)", "x1")
    _check(&j.x, &j.d, "swiglu (ggml_swiglu)", "dst")
    _run(&j, n_threads)


def _unary(int op, str fn, const float[:, :, :, :] x not None, float[:, :, :, :] dst not None,
           int n_threads):
    check_n_threads(fn, n_threads)
    cdef Job j
    j.op = op
    arr4_set(&j.x, x)
    arr4_set(&j.d, dst)
    _check(&j.x, &j.d, fn, "dst")
    _run(&j, n_threads)


def sin(const float[:, :, :, :] x not None, float[:, :, :, :] dst not None, int n_threads):
    """``dst = sin(x)`` (ggml_sin)."""
    _unary(_SIN, "sin (ggml_sin)", x, dst, n_threads)


def cos(const float[:, :, :, :] x not None, float[:, :, :, :] dst not None, int n_threads):
    """``dst = cos(x)`` (ggml_cos)."""
    _unary(_COS, "cos (ggml_cos)", x, dst, n_threads)
