"""The CuPy backend: graphs computed on an NVIDIA GPU (the role of ggml's CUDA backend).

Install the optional dependency with ``pip install -e ".[gpu]"`` (the ``cupy-cuda12x`` wheel,
for CUDA 12 drivers). Only :func:`ggopt.backend.cupy_init` imports this module, and CuPy itself
is imported when a :class:`CuPyBackend` is created, so ``import ggopt`` never needs CuPy.

Every op is the array backend's code (:mod:`ggopt.backend.array.ops`) over CuPy arrays, except
the ones every training step runs, which are fused CUDA kernels (:mod:`.ops`): the AdamW and
SGD updates, the element-wise unary functions and their derivatives, and cross-entropy forward
and backward. The scheduler hands a backend runs of nodes (``Backend.compile_nodes``); this one
compiles a run node by node, so an add followed by a relu stays two kernels: fusing them would
need the add's result in memory anyway, for the relu's backward pass.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ...errors import BackendUnavailableError, DTypeError, InvalidValueError
from ...tensor import Tensor
from ..array.backend import ArrayBackend
from ..base import Placement, Step
from ..buffer import Buffer
from .ops import FUSED_COMPILERS

__all__ = ["CuPyBackend"]

_FN = "ggml_backend_cuda_init"


def _import_cupy() -> tuple[ModuleType, ModuleType]:
    try:
        import cupy
        import cupyx
    except (ImportError, OSError, RuntimeError) as exc:
        raise BackendUnavailableError(
            f'{_FN}: CuPy is not available ({type(exc).__name__}: {exc}); install it with '
            'pip install -e ".[gpu]" (cupy-cuda12x)'
        ) from exc
    return cupy, cupyx


def _open_device(cupy: ModuleType, device: int) -> Any:
    """The ``cupy.cuda.Device``, after a small kernel ran on it (driver, runtime and NVRTC)."""
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except (RuntimeError, OSError) as exc:
        raise BackendUnavailableError(
            f"{_FN}: no usable CUDA device ({type(exc).__name__}: {exc})") from exc
    if device >= count:
        raise BackendUnavailableError(
            f"{_FN}: CUDA device {device} requested, {count} device(s) present")
    dev = cupy.cuda.Device(device)
    try:
        with dev:
            float((cupy.arange(4, dtype=cupy.float32) * 2).sum())
    except Exception as exc:  # any failure here means the device cannot run ggopt's kernels
        raise BackendUnavailableError(
            f"{_FN}: CUDA device {device} cannot run kernels ({type(exc).__name__}: {exc})"
        ) from exc
    return dev


class CuPyBackend(ArrayBackend):
    """Computes on CUDA device ``device`` with CuPy (ggml_backend_cuda).

    Raises
    ------
    BackendUnavailableError
        CuPy is not installed, or no usable CUDA device ``device`` exists; the message says why.
    """

    def __init__(self, device: int = 0) -> None:
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            raise DTypeError(f"{_FN}: device must be an int, got {device!r}")
        if device < 0:
            raise InvalidValueError(f"{_FN}: device must be >= 0, got {device}")
        cupy, cupyx = _import_cupy()
        dev = _open_device(cupy, int(device))
        super().__init__(cupy, f"CUDA{int(device)}")
        self.device = int(device)
        self._dev = dev
        self._scatter_add = cupyx.scatter_add
        self._compilers.update(FUSED_COMPILERS)

    # --- array-module hooks -------------------------------------------------------------------
    def _alloc(self, nbytes: int) -> Any:
        with self._dev:
            return self.xp.empty(nbytes, dtype=self.xp.uint8)

    def _bytes_view(self, data: Any, offset: int, shape: tuple[int, ...],
                    strides: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self.xp.ndarray(shape, dtype, memptr=data.data + offset, strides=strides)

    def to_host(self, arr: Any) -> np.ndarray:
        with self._dev:
            host: np.ndarray = arr.get()
            return host

    def from_host(self, dst: Any, host: np.ndarray) -> None:
        with self._dev:
            if dst.flags.c_contiguous and host.dtype == dst.dtype:
                dst.set(np.ascontiguousarray(host).reshape(dst.shape))
            else:
                dst[...] = self.xp.asarray(host).reshape(dst.shape)

    def scatter_add(self, dst: Any, idx: Any, src: Any) -> None:
        self._scatter_add(dst, idx, src)

    def _wrap(self, step: Step) -> Step:
        dev = self._dev

        def on_device() -> None:
            with dev:
                step()

        return on_device

    # --- backend interface ----------------------------------------------------------------
    def fill(self, t: Tensor, value: float) -> None:
        with self._dev:
            super().fill(t, value)

    def array_at(self, buf: Buffer, offset: int, t: Tensor) -> Any:
        with self._dev:
            return super().array_at(buf, offset, t)

    def compile_node(self, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step | None:
        with self._dev:  # compilers allocate scratch arrays
            return super().compile_node(node, srcs, mem)

    def copy_step(self, src: Tensor, dst: Tensor, mem: Placement) -> Step:
        with self._dev:
            return super().copy_step(src, dst, mem)

    def synchronize(self) -> None:
        self._dev.synchronize()
