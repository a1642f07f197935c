"""Optimizer steps: one fused pass over the parameters, updated in place (float32).

The formulas are ggml's ``ggml_opt_step_adamw`` and ``ggml_opt_step_sgd``, evaluated in float32
in the same order.
"""

from cython.parallel cimport prange
from ggopt._kernels._common cimport check_n_threads

cimport ggopt._kernels._common  # for its C block: GGOPT_MULTIVERSION

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

# Below this many parameters a step stays on one thread, without entering an OpenMP region
# (even a region whose if-clause is false costs about a microsecond in libgomp).
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 13)
# Parameters per work item: threads take contiguous chunks of this size.
cdef Py_ssize_t _CHUNK = 1 << 14

cdef extern from *:
    """
    /* ggml_compute_forward_opt_step_adamw_f32 over n contiguous parameters (the update of one
       element is ggopt_adamw1 of scalar_math.h). keep = 1 - alpha*wd. */
    GGOPT_MULTIVERSION
    static void ggopt_adamw(float *w, const float *g, float *m, float *v, Py_ssize_t n,
                            float alpha, float b1, float b2, float eps, float keep, float b1h,
                            float b2h) {
        for (Py_ssize_t i = 0; i < n; i++)
            w[i] = ggopt_adamw1(w[i], g[i], &m[i], &v[i], alpha, b1, b2, eps, keep, b1h, b2h);
    }

    /* ggml_compute_forward_opt_step_sgd_f32 (ggopt_sgd1 per element) */
    GGOPT_MULTIVERSION
    static void ggopt_sgd(float *w, const float *g, Py_ssize_t n, float alpha, float keep) {
        for (Py_ssize_t i = 0; i < n; i++) w[i] = ggopt_sgd1(w[i], g[i], alpha, keep);
    }
    """
    void _adamw_chunk "ggopt_adamw"(float *w, const float *g, float *m, float *v, Py_ssize_t n,
                                    float alpha, float b1, float b2, float eps, float keep,
                                    float b1h, float b2h) noexcept nogil
    void _sgd_chunk "ggopt_sgd"(float *w, const float *g, Py_ssize_t n, float alpha,
                                float keep) noexcept nogil


def adamw_step(float[::1] w not None, const float[::1] g not None, float[::1] m not None,
               float[::1] v not None, const float[::1] params not None, int n_threads):
    """One AdamW step in place (ggml_opt_step_adamw).

    ``params = [alpha, beta1, beta2, eps, wd, beta1h, beta2h]`` where ``beta1h = 1/(1 - beta1^t)``
    and ``beta2h = 1/(1 - beta2^t)``. Per element, in float32::

        m = m*beta1 + g*(1 - beta1);  v = v*beta2 + g*g*(1 - beta2)
        w = w*(1 - alpha*wd) - alpha*(m*beta1h) / (sqrt(v*beta2h) + eps)
    """
    check_n_threads("adamw_step", n_threads)
    cdef Py_ssize_t n = w.shape[0], nchunks, k, start
    cdef float alpha, b1, b2, eps, keep, b1h, b2h
    if g.shape[0] != n or m.shape[0] != n or v.shape[0] != n:
        raise ShapeError(
            f"adamw_step (ggml_opt_step_adamw): w, g, m and v must have the same length; "
            f"got {n}, {g.shape[0]}, {m.shape[0]}, {v.shape[0]}"
        )
    if params.shape[0] != 7:
        raise ShapeError(
            f"adamw_step (ggml_opt_step_adamw): params must hold 7 values "
            f"[alpha, beta1, beta2, eps, wd, beta1h, beta2h], got {params.shape[0]}"
        )
    if n == 0:
        return
    alpha = params[0]
    b1 = params[1]
    b2 = params[2]
    eps = params[3]
    keep = 1 - alpha * params[4]
    b1h = params[5]
    b2h = params[6]
    if n_threads < 2 or n < _PAR_MIN_WORK:  # no OpenMP region at all
        with nogil:
            _adamw_chunk(&w[0], &g[0], &m[0], &v[0], n, alpha, b1, b2, eps, keep, b1h, b2h)
        return
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for k in prange(nchunks, nogil=True, num_threads=n_threads, schedule="static"):
        start = k * _CHUNK
        _adamw_chunk(&w[start], &g[start], &m[start], &v[start], min(_CHUNK, n - start),
                     alpha, b1, b2, eps, keep, b1h, b2h)


def sgd_step(float[::1] w not None, const float[::1] g not None, const float[::1] params not None,
             int n_threads):
    """One SGD step in place (ggml_opt_step_sgd): ``w = w*(1 - alpha*wd) - alpha*g``.

    ``params = [alpha, wd]``.
    """
    check_n_threads("sgd_step", n_threads)
    cdef Py_ssize_t n = w.shape[0], nchunks, k, start
    cdef float alpha, keep
    if g.shape[0] != n:
        raise ShapeError(
            f"sgd_step (ggml_opt_step_sgd): w and g must have the same length; "
            f"got {n} and {g.shape[0]}"
        )
    if params.shape[0] != 2:
        raise ShapeError(
            f"sgd_step (ggml_opt_step_sgd): params must hold 2 values [alpha, wd], "
            f"got {params.shape[0]}"
        )
    if n == 0:
        return
    alpha = params[0]
    keep = 1 - alpha * params[1]
    if n_threads < 2 or n < _PAR_MIN_WORK:  # no OpenMP region at all
        with nogil:
            _sgd_chunk(&w[0], &g[0], n, alpha, keep)
        return
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for k in prange(nchunks, nogil=True, num_threads=n_threads, schedule="static"):
        start = k * _CHUNK
        _sgd_chunk(&w[start], &g[start], min(_CHUNK, n - start), alpha, keep)
