"""Cross-entropy on label ids (ggopt's own op ``cross_entropy_loss_ids``): the loss and the
logits' gradient of ggml_cross_entropy_loss(_back) with one-hot label rows, read from one int32
id per row instead of an [nrows, nclasses] float32 array.

A row whose id is ``ignore_id`` takes no part: it adds nothing to the sum (which is still
divided by all the rows, as one-hot with an all-zero row) and gets a zero gradient. Every other
id must be in ``[0, nclasses)``: InvalidValueError before anything is written. Row by row the
arithmetic is ``_softmax.pyx``'s contiguous-row code (the same max, exps, sums and roundings),
so the loss and the gradient rows equal cross_entropy_loss(_back) with one-hot labels bit for
bit. The rows' terms are computed in parallel and summed in row order on one thread, and a
gradient row is one thread's, so nothing depends on ``n_threads``.
"""

from cython.parallel cimport prange
from libc.stdint cimport int32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from ggopt._kernels._common cimport check_n_threads

import numpy as np

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import InvalidValueError, ShapeError

cdef extern from "_softmax_rows.h" nogil:
    pass

cdef extern from *:
    """
    /* (x[t] - max) - log(sum exp(x - max)) over a contiguous row: its log-softmax at t, in
       float32 as the one-hot cross-entropy computes every element (ggopt_ce_rows). */
    GGOPT_MULTIVERSION
    static double ggopt_ce_id_row(const float *x, Py_ssize_t n, Py_ssize_t t) {
        float m = ggopt_row_max(x, n, 1.0f);
        float lsum = logf((float)ggopt_row_expsum(x, n, 1.0f, m));
        return (double)((x[t] - m) - lsum);
    }

    /* d = (softmax(x) - one_hot(t)) * g over a contiguous row (d may be x), element for
       element as ggopt_ce_back_rows computes it with a one-hot label row: x - 0.0f == x. */
    GGOPT_MULTIVERSION
    static void ggopt_ce_id_back_row(const float *x, float *d, Py_ssize_t n, Py_ssize_t t,
                                     float g) {
        float m = ggopt_row_max(x, n, 1.0f);
        float inv = 1.0f / (float)ggopt_row_exp(d, x, n, 1.0f, m);
        float et = d[t];
        for (Py_ssize_t i = 0; i < n; i++) d[i] = (d[i] * inv) * g;
        d[t] = (et * inv - 1.0f) * g;
    }
    """
    double ggopt_ce_id_row(const float *x, Py_ssize_t n, Py_ssize_t t) noexcept nogil
    void ggopt_ce_id_back_row(const float *x, float *d, Py_ssize_t n, Py_ssize_t t,
                              float g) noexcept nogil

# Below this many element-operations a kernel stays on one thread (one exp costs 16).
cdef Py_ssize_t _PAR_MIN_WORK = min_parallel_work(1 << 15)


cdef object _check(str fn, object logits, const int32_t[:] ids, int ignore_id):
    """Shapes and ids; returns the logits with contiguous rows (a copy only when their
    elements are strided)."""
    cdef Py_ssize_t nrows = logits.shape[0], n = logits.shape[1], r
    cdef int32_t v
    if ids.shape[0] != nrows:
        raise ShapeError(f"{fn}: {ids.shape[0]} label ids for {nrows} rows of logits; expected "
                         "one id per row")
    if nrows == 0 or n == 0:
        raise ShapeError(f"{fn}: logits of shape ({nrows}, {n}) need at least one row and one "
                         "class (the loss is a mean over rows)")
    for r in range(nrows):
        v = ids[r]
        if v != ignore_id and (v < 0 or v >= n):
            raise InvalidValueError(f"{fn}: the label id of row {r} is {v}, out of range: "
                                    f"expected a class in [0, {n}) or the ignore id "
                                    f"{ignore_id}")
    if logits.strides[1] != 4:
        return np.ascontiguousarray(logits)
    return logits


def cross_entropy_loss_ids(const float[:, :] logits not None, const int32_t[:] ids not None,
                           int ignore_id, int n_threads):
    """Mean over rows of ``-log_softmax(logits)[r, ids[r]]``, rows with ``ids[r] ==
    ignore_id`` adding 0 (cross_entropy_loss with one-hot labels). Arrays: logits (nrows,
    nclasses), ids (nrows,). The result is returned rounded to float32."""
    fn = "cross_entropy_loss_ids"
    check_n_threads(fn, n_threads)
    cdef const float[:, :] x = _check(fn, logits, ids, ignore_id)
    cdef Py_ssize_t nrows = x.shape[0], n = x.shape[1], xr = x.strides[0], r
    cdef const char *base = <const char *>&x[0, 0]
    cdef double total = 0
    cdef double *terms = <double *>malloc(nrows * sizeof(double))
    if terms == NULL:
        raise MemoryError(f"{fn}: {nrows} row terms")
    try:
        with nogil:
            if n_threads > 1 and nrows > 1 and nrows * n * 16 >= _PAR_MIN_WORK:
                for r in prange(nrows, num_threads=n_threads, schedule="static"):
                    terms[r] = 0.0 if ids[r] == ignore_id else \
                        ggopt_ce_id_row(<const float *>(base + r * xr), n, ids[r])
            else:
                for r in range(nrows):
                    terms[r] = 0.0 if ids[r] == ignore_id else \
                        ggopt_ce_id_row(<const float *>(base + r * xr), n, ids[r])
            for r in range(nrows):
                total += terms[r]
    finally:
        free(terms)
    return <float>(-total / nrows)


def cross_entropy_loss_ids_back(float grad, const float[:, :] logits not None,
                                const int32_t[:] ids not None, float[:, :] dst not None,
                                int ignore_id, int n_threads):
    """``dst = (softmax(logits) - one_hot(ids)) * (grad / nrows)``, rows with ``ids[r] ==
    ignore_id`` zero (cross_entropy_loss_back with one-hot labels). ``dst`` (nrows, nclasses)
    has contiguous rows and may be ``logits``' memory."""
    fn = "cross_entropy_loss_ids_back"
    check_n_threads(fn, n_threads)
    cdef const float[:, :] x = _check(fn, logits, ids, ignore_id)
    cdef Py_ssize_t nrows = x.shape[0], n = x.shape[1], xr = x.strides[0], r
    if dst.shape[0] != nrows or dst.shape[1] != n:
        raise ShapeError(f"{fn}: dst must have the logits' shape ({nrows}, {n}), got "
                         f"({dst.shape[0]}, {dst.shape[1]})")
    if dst.strides[1] != 4:
        raise ShapeError(f"{fn}: dst rows must be contiguous (element stride 4 bytes), got "
                         f"{dst.strides[1]}")
    cdef const char *base = <const char *>&x[0, 0]
    cdef char *out = <char *>&dst[0, 0]
    cdef Py_ssize_t dr = dst.strides[0]
    cdef float g = grad / <float>nrows
    with nogil:
        if n_threads > 1 and nrows > 1 and nrows * n * 16 >= _PAR_MIN_WORK:
            for r in prange(nrows, num_threads=n_threads, schedule="static"):
                if ids[r] == ignore_id:
                    memset(out + r * dr, 0, n * sizeof(float))
                else:
                    ggopt_ce_id_back_row(<const float *>(base + r * xr),
                                         <float *>(out + r * dr), n, ids[r], g)
        else:
            for r in range(nrows):
                if ids[r] == ignore_id:
                    memset(out + r * dr, 0, n * sizeof(float))
                else:
                    ggopt_ce_id_back_row(<const float *>(base + r * xr),
                                         <float *>(out + r * dr), n, ids[r], g)
