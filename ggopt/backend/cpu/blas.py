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

import os
import threading
from types import TracebackType
from typing import Any, ClassVar

from ...errors import InvalidValueError
from . import threads as _threads

__all__ = ["BLAS_CHOICES", "SerialBlas", "products_blas", "sgemm_address"]


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
_mkl_handle: Any = None  # oneMKL's runtime library, kept loaded once chosen

BLAS_NAMES = {"mkl": "oneMKL (sgemm_64, sequential)", "openblas": "NumPy's OpenBLAS",
              "scipy": "SciPy's BLAS (sgemm)"}
"""What :func:`products_blas` returns for each choice ``GGOPT_BLAS`` may name."""
BLAS_CHOICES = tuple(BLAS_NAMES)
"""What ``GGOPT_BLAS`` may name; unset, mkl and openblas are tried in the order
:func:`products_blas` describes (it depends on the CPU), then scipy."""

_MKL_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL, mkl_service.h


def products_blas() -> str:
    """Choose, once per process, the ``sgemm`` that the matrix products call; returns its name.

    The first that is installed and multiplies a small product exactly, of: **oneMKL** (the
    ``mkl`` package, a dependency on Linux x86-64; its ILP64 ``sgemm_64`` on its sequential
    threading layer), NumPy's own **OpenBLAS** when NumPy ships an ILP64 build exporting
    ``scipy_sgemm_64_`` (or ``sgemm_64_``), as NumPy's wheels do, and **SciPy's**
    (``scipy.linalg.cython_blas``). oneMKL comes first on an Intel CPU or one with AVX-512
    (5-20 % faster than OpenBLAS per thread on an LLM's shapes on a Xeon with AVX-512; Intel
    CPUs without it and AMD's with it were not measured), OpenBLAS first on the others (on an
    AMD Zen 3 without AVX-512 oneMKL ran at 0.76-1.02x OpenBLAS's speed on SmolLM2's and
    MNIST's products, 0.30x on a 10-wide one, 1.32x on that one's ``dW``, and whole fine-tune
    steps took 4-5 % longer; docs/f32-products.md). The environment variable ``GGOPT_BLAS``
    (``mkl``, ``openblas`` or ``scipy``) picks one; naming one that is not available raises
    :class:`~ggopt.errors.InvalidValueError`.
    """
    global _products_blas
    with _choose_lock:
        if _products_blas is None:
            _products_blas = _choose(os.environ.get("GGOPT_BLAS", "").strip().lower())
        return _products_blas


def sgemm_address(which: str) -> int | None:
    """The address of the ILP64 ``sgemm`` of ``which`` (``"mkl"`` or ``"openblas"``), or None
    when that library is not installed (or, for oneMKL, runs on another threading layer)."""
    if which == "mkl":
        return _mkl_sgemm()
    if which == "openblas":
        return _numpy_openblas_sgemm()
    raise InvalidValueError(f"sgemm_address: which must be 'mkl' or 'openblas', got {which!r}")


def _choose(wanted: str) -> str:
    from ..._kernels import _gemm

    if wanted not in ("", *BLAS_CHOICES):
        raise InvalidValueError(f"GGOPT_BLAS={wanted!r}: expected one of {', '.join(BLAS_CHOICES)}"
                                " (or unset: the fastest installed)")
    for which in ("mkl", "openblas") if _gemm.cpu_favours_mkl() else ("openblas", "mkl"):
        if wanted not in ("", which):
            continue
        address = sgemm_address(which)
        if address and _works(_gemm, address):
            return BLAS_NAMES[which]
        if wanted == which:
            raise InvalidValueError(f"GGOPT_BLAS={which}: {BLAS_NAMES[which]} is not available here"
                                    f"{' (pip install mkl)' if which == 'mkl' else ''}")
    _gemm.use_ilp64_sgemm(0)
    return BLAS_NAMES["scipy"]


def _mkl_sgemm() -> int | None:
    """oneMKL's ``sgemm_64`` from the ``mkl`` package's ``libmkl_rt``, its threading layer set
    to sequential (every call then runs on the thread that makes it)."""
    global _mkl_handle
    import ctypes
    from importlib import metadata

    try:
        files = metadata.files("mkl") or []
    except metadata.PackageNotFoundError:
        return None
    paths = [os.path.realpath(str(f.locate())) for f in files if f.name.startswith("libmkl_rt.so")]
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            set_layer = lib.MKL_Set_Threading_Layer
            address = ctypes.cast(lib.sgemm_64, ctypes.c_void_p).value
        except (AttributeError, OSError):
            continue
        set_layer.argtypes, set_layer.restype = [ctypes.c_int], ctypes.c_int
        if set_layer(_MKL_SEQUENTIAL) != _MKL_SEQUENTIAL:
            return None  # an MKL already started threaded in this process: its calls would nest
        _mkl_handle = lib
        return address
    return None


def _numpy_openblas_sgemm() -> int | None:
    """The ILP64 ``sgemm`` of the OpenBLAS inside NumPy's install (numpy.libs, numpy/.dylibs)."""
    import ctypes

    import numpy as np

    numpy_dir = os.path.dirname(os.path.realpath(np.__file__))
    for lib in _threads.threadpool_controller().lib_controllers:
        path = os.path.realpath(lib.filepath or "")
        if lib.internal_api != "openblas" or not path.startswith(numpy_dir):
            continue
        for name in ("scipy_sgemm_64_", "sgemm_64_"):
            try:
                address = ctypes.cast(getattr(ctypes.CDLL(path), name), ctypes.c_void_p).value
            except (AttributeError, OSError):
                continue
            if address:
                return int(address)
    return None


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
