"""BLAS on one thread while graphs compute: an object each scheduler owns.

OpenBLAS sums a product's K dimension differently depending on its thread count and on how the
output is partitioned. ggopt therefore runs every product of a graph compute with BLAS on one
thread, over slices whose bounds depend only on the shapes, spread over its own worker threads
(``ops/linalg.py``): the results are the same bits for any thread count. Outside computes
BLAS follows :func:`ggopt.set_n_threads`.

The BLAS libraries' thread count is process state, so every :class:`SerialBlas` shares one
count of the computes in flight, under a lock: the first compute in sets one thread, the last
one out restores what was there. Two schedulers computing on two Python threads therefore never
undo each other's setting.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, ClassVar

from . import threads as _threads

__all__ = ["SerialBlas", "products_blas"]


class SerialBlas:
    """A context manager that holds BLAS on one thread while at least one compute runs."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _active: ClassVar[int] = 0
    _saved: ClassVar[list[int]] = []
    _libs: ClassVar[list[Any] | None] = None  # threadpoolctl controllers of the BLAS libraries

    @classmethod
    def _controllers(cls) -> list[Any]:
        if cls._libs is None:
            cls._libs = [c for c in _threads.threadpool_controller().lib_controllers
                         if c.user_api == "blas"]
        return cls._libs

    def __enter__(self) -> SerialBlas:
        cls = type(self)
        with cls._lock:
            if cls._active == 0:
                libs = cls._controllers()
                cls._saved = [c.num_threads for c in libs]
                for c, n in zip(libs, cls._saved):
                    if n != 1:
                        c.set_num_threads(1)
            cls._active += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        cls = type(self)
        with cls._lock:
            cls._active -= 1
            if cls._active == 0:
                for c, n in zip(cls._controllers(), cls._saved):
                    if n != 1:
                        c.set_num_threads(n)


_products_blas: str | None = None  # what the GemmPlans call, once chosen
_choose_lock = threading.Lock()


def products_blas() -> str:
    """Choose, once per process, the ``sgemm`` that the matrix products call; returns its name.

    NumPy's own OpenBLAS when NumPy ships an ILP64 build that exports ``scipy_sgemm_64_`` (or
    ``sgemm_64_``), as NumPy's wheels do: ggopt's products then run on the BLAS NumPy's
    ``matmul`` uses (the newer of the two copies in a usual install, and the one the bench's
    products-alone floor measures). Otherwise, or when that function fails a check on a small
    product, SciPy's (``scipy.linalg.cython_blas``).
    """
    global _products_blas
    with _choose_lock:
        if _products_blas is None:
            _products_blas = _choose()
        return _products_blas


def _choose() -> str:
    import ctypes
    import os

    import numpy as np

    from ..._kernels import _gemm

    numpy_dir = os.path.dirname(os.path.realpath(np.__file__))
    for lib in _threads.threadpool_controller().lib_controllers:
        path = os.path.realpath(lib.filepath or "")
        if lib.internal_api != "openblas" or not path.startswith(numpy_dir):
            continue  # only the copy inside NumPy's install (numpy.libs, numpy/.dylibs)
        for name in ("scipy_sgemm_64_", "sgemm_64_"):
            try:
                address = ctypes.cast(getattr(ctypes.CDLL(path), name), ctypes.c_void_p).value
            except (AttributeError, OSError):
                continue
            if address and _works(_gemm, address):
                return f"NumPy's OpenBLAS ({name})"
    _gemm.use_ilp64_sgemm(0)
    return "SciPy's BLAS (sgemm)"


def _works(gemm: Any, address: int) -> bool:
    """Use the ILP64 sgemm at ``address`` if it multiplies a small product exactly."""
    import numpy as np

    x = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    y = np.array([[1, 0, 2, 1], [0, 1, 1, 2]], dtype=np.float32)
    gemm.use_ilp64_sgemm(address)
    out = np.full((3, 4), np.nan, np.float32)
    plan = gemm.GemmPlan()
    plan.add(x, y.T.copy().T, out)  # y as a transposed view: both operand layouts
    plan.run(1)
    if np.array_equal(out, x @ y):
        return True
    gemm.use_ilp64_sgemm(0)
    return False
