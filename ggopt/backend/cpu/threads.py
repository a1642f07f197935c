"""The process-wide thread setting shared by the OpenMP kernels and BLAS.

ggml passes ``n_threads`` to every CPU graph compute (``ggml_backend_cpu_set_n_threads``); ggopt
keeps one setting for the whole process. Kernels read it through :func:`get_n_threads`; numpy's
BLAS (NumPy's, and SciPy's that the matrix-product kernel calls) is limited to the same count
with threadpoolctl, so the two never oversubscribe the cores.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..._kernels._openmp_helpers import omp_max_threads
from ..._kernels._openmp_helpers import openmp_enabled as _openmp_enabled
from ...errors import DTypeError, InvalidValueError

__all__ = ["get_n_threads", "openmp_enabled", "set_n_threads", "MAX_N_THREADS", "check_n_threads"]

#: The most threads a kernel may be asked for: four per CPU, at least 512 (far beyond any useful
#: count). OpenMP runtimes end the process when a parallel region asks for more threads than
#: they or the system can start (libgomp: SIGSEGV at 100,000, a fatal "Thread creation failed"
#: once the system's thread limit is reached), so larger counts are refused up front.
MAX_N_THREADS = max(512, 4 * (os.cpu_count() or 1))


def openmp_enabled() -> bool:
    """Whether the kernels were built with OpenMP (without it they always run on one thread)."""
    return bool(_openmp_enabled())


def _default_n_threads() -> int:
    """``min(os.cpu_count(), omp_get_max_threads())``, or the latter alone if ``OMP_NUM_THREADS``
    is set.

    This is scikit-learn's ``_openmp_effective_n_threads(None)`` rule: an explicit
    ``OMP_NUM_THREADS`` wins, otherwise never more threads than CPUs.
    """
    max_threads = min(omp_max_threads(), MAX_N_THREADS) if _openmp_enabled() else 1
    if os.environ.get("OMP_NUM_THREADS"):
        return max(1, max_threads)
    return max(1, min(max_threads, os.cpu_count() or 1))


def check_n_threads(n: object, fn: str) -> int:
    """``n`` as an int in ``[1, MAX_N_THREADS]``; DTypeError/InvalidValueError otherwise."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise DTypeError(f"{fn}: n_threads must be an int or None, got {type(n).__name__}")
    n = int(n)
    if not 1 <= n <= MAX_N_THREADS:
        raise InvalidValueError(
            f"{fn}: n_threads must be a positive number of threads, at most {MAX_N_THREADS} "
            f"(4 per CPU, at least 512), got {n}"
        )
    return n


_n_threads: int = _default_n_threads()  # what the kernels use
_blas_controller = None  # threadpoolctl.ThreadpoolController, created on first use
_blas_limiter = None  # the active BLAS limit; kept alive so that it stays in force
_blas_limit: int | None = None  # the count the limiter sets (None: BLAS's own default)


def set_n_threads(n: int | None) -> None:
    """Set how many threads the CPU kernels and BLAS use (``ggml_backend_cpu_set_n_threads``).

    Parameters
    ----------
    n : int or None
        A positive thread count, or None for the default: ``min(os.cpu_count(),
        omp_get_max_threads())`` (``OMP_NUM_THREADS`` is respected when set). None also hands
        BLAS back its own default. In a build without OpenMP the kernels always run on one
        thread, but BLAS still follows ``n``.

    Raises
    ------
    DTypeError
        ``n`` is not an integer (a TypeError).
    InvalidValueError
        ``n`` is not in ``[1, MAX_N_THREADS]`` (a ValueError).
    """
    global _n_threads
    if n is None:
        _n_threads = _default_n_threads()
        _limit_blas(None)
        return
    n = check_n_threads(n, "set_n_threads (ggml_backend_cpu_set_n_threads)")
    _n_threads = n if _openmp_enabled() else 1
    _limit_blas(n)


def get_n_threads() -> int:
    """The number of threads the CPU kernels use (always 1 in a build without OpenMP)."""
    return _n_threads


def threadpool_controller() -> Any:
    """threadpoolctl's controller of the loaded libraries, scanned once, after loading the
    matrix-product kernel so that SciPy's BLAS (which it calls) is among them."""
    global _blas_controller
    if _blas_controller is None:
        from threadpoolctl import ThreadpoolController

        from ..._kernels import _gemm  # noqa: F401 - loads SciPy's BLAS before the scan

        _blas_controller = ThreadpoolController()
    return _blas_controller


def _limit_blas(n: int | None) -> None:
    """Limit BLAS to ``n`` threads (at most one per CPU: OpenBLAS starts every thread it is
    given at once), or restore its original limits when ``n`` is None."""
    global _blas_limiter, _blas_limit
    if n == _blas_limit:
        return
    if _blas_limiter is not None:
        _blas_limiter.restore_original_limits()
        _blas_limiter = None
    if n is not None:
        _blas_limiter = threadpool_controller().limit(limits=min(n, os.cpu_count() or 1),
                                                      user_api="blas")
    _blas_limit = n


# --- the worker threads of the CPU products (see cpu/blas.py and cpu/ops/linalg.py) -------

_pool = None  # concurrent.futures.ThreadPoolExecutor, grown on demand
_pool_workers = 0


def run_concurrently(tasks: Sequence[Callable[[], object]]) -> None:
    """Run zero-argument callables at the same time (the first on this thread) and wait.

    The tasks must release the GIL to overlap (NumPy's matmul does). Exceptions propagate.
    """
    global _pool, _pool_workers
    if len(tasks) == 1:
        tasks[0]()
        return
    if _pool is None or _pool_workers < len(tasks) - 1:
        from concurrent.futures import ThreadPoolExecutor

        if _pool is not None:
            _pool.shutdown(wait=True)
        _pool_workers = len(tasks) - 1
        _pool = ThreadPoolExecutor(max_workers=_pool_workers, thread_name_prefix="ggopt")
    futures = [_pool.submit(t) for t in tasks[1:]]
    try:
        tasks[0]()
    finally:
        for f in futures:
            f.result()
