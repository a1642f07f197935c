"""Shard gathering for ``Dataset.get_batch``: whole shards copied with memcpy, in parallel."""

from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy
from ggopt._kernels._common cimport check_n_threads

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import ShapeError

# Below this many bytes a gather stays on one thread.
cdef Py_ssize_t _PAR_MIN_BYTES = min_parallel_work(1 << 14)
# Shards up to this size are prefetched _PREFETCH_AHEAD shards ahead: a small shard at a random
# place is over before the hardware prefetcher has caught on.
cdef Py_ssize_t _PREFETCH_MAX_BYTES = 1 << 13
cdef Py_ssize_t _PREFETCH_AHEAD = 2

cdef extern from *:
    """
    /* Ask for the cache lines of [p, p + n) ahead of use (a no-op without GCC builtins). */
    static inline void ggopt_prefetch_range(const unsigned char *p, Py_ssize_t n) {
    #if defined(__GNUC__) || defined(__clang__)
        for (Py_ssize_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 0);
    #else
        (void)p; (void)n;
    #endif
    }
    """
    void _prefetch "ggopt_prefetch_range"(const uint8_t *p, Py_ssize_t n) noexcept nogil


def gather_shards(const uint8_t[::1] src not None, uint8_t[::1] dst not None,
                  const int64_t[::1] perm not None, Py_ssize_t first, Py_ssize_t nshards,
                  Py_ssize_t shard_nbytes, int n_threads):
    """Copy shards ``perm[first:first+nshards]`` of ``src`` to consecutive places in ``dst``.

    For k in range(nshards): ``dst[k*shard_nbytes:(k+1)*shard_nbytes] =
    src[perm[first+k]*shard_nbytes:(perm[first+k]+1)*shard_nbytes]``
    (the copy loop of ggml_opt_dataset_get_batch). Every index is checked before anything is
    copied.
    """
    check_n_threads("gather_shards", n_threads)
    cdef Py_ssize_t k, nsrc, ahead
    cdef int64_t p
    cdef const uint8_t *s
    cdef uint8_t *d
    if first < 0 or nshards < 0 or shard_nbytes < 0 or first + nshards > perm.shape[0]:
        raise ShapeError(
            f"gather_shards (ggml_opt_dataset_get_batch): shards [{first}, {first + nshards}) "
            f"of shard_nbytes={shard_nbytes} do not fit a permutation of {perm.shape[0]} shards"
        )
    if nshards == 0 or shard_nbytes == 0:
        return
    if dst.shape[0] < nshards * shard_nbytes:
        raise ShapeError(
            f"gather_shards (ggml_opt_dataset_get_batch): dst holds {dst.shape[0]} bytes, "
            f"{nshards} shards of {shard_nbytes} bytes need {nshards * shard_nbytes}"
        )
    nsrc = src.shape[0] // shard_nbytes
    for k in range(first, first + nshards):
        p = perm[k]
        if p < 0 or p >= nsrc:
            raise ShapeError(
                f"gather_shards (ggml_opt_dataset_get_batch): perm[{k}] = {p} is not a shard "
                f"of src, which holds {nsrc} shards of {shard_nbytes} bytes"
            )
    s = &src[0]
    d = &dst[0]
    ahead = _PREFETCH_AHEAD if shard_nbytes <= _PREFETCH_MAX_BYTES else 0
    if n_threads < 2 or nshards < 2 or nshards * shard_nbytes < _PAR_MIN_BYTES:
        with nogil:  # no OpenMP region at all (it costs about a microsecond even when serial)
            for k in range(nshards):
                if ahead > 0 and k + ahead < nshards:
                    _prefetch(s + perm[first + k + ahead] * shard_nbytes, shard_nbytes)
                memcpy(d + k * shard_nbytes, s + perm[first + k] * shard_nbytes, shard_nbytes)
        return
    for k in prange(nshards, nogil=True, num_threads=n_threads, schedule="static"):
        if ahead > 0 and k + ahead < nshards:
            _prefetch(s + perm[first + k + ahead] * shard_nbytes, shard_nbytes)
        memcpy(d + k * shard_nbytes, s + perm[first + k] * shard_nbytes, shard_nbytes)
