"""Backends, buffers and the scheduler (ggml-backend), grouped by device as ggml is.

The generic parts sit here: the ``Backend`` interface (``base``), buffers, the memory planner
(``alloc``), the scheduler and its plan cache, node fusion detection. Each device has its own
package: ``cpu/`` (the CPU backend, its compilers, threads, BLAS and float-mode policies),
``array/`` (NumPy/CuPy array code, the reference oracle), ``cuda/`` (CuPy and fused kernels).
``cpu_init`` gives the CPU backend; ``cupy_init`` (imported only when called) the GPU one.
"""

from __future__ import annotations

# isort: off
from .cpu import CPUBackend, cpu_init, host_backend  # first: the OpenMP wait policy (cpu/)
# isort: on

import contextlib

import numpy as np
import numpy.typing as npt

from ..context import Context, set_host_allocator
from ..errors import DTypeError
from ..tensor import Tensor
from .base import Backend, _check_transfer
from .buffer import Buffer, align, buffer_of, init_view
from .sched import Scheduler

__all__ = [
    "Backend", "Buffer", "CPUBackend", "Scheduler", "cpu_init", "cupy_init",
    "alloc_ctx_tensors", "tensor_set", "tensor_get", "tensor_fill",
]


# Contexts created with no_alloc=False take their memory from the shared host backend.
set_host_allocator(lambda nbytes: host_backend().alloc_buffer(nbytes))


def alloc_ctx_tensors(ctx: Context, backend: Backend) -> Buffer | None:
    """Give every tensor of ``ctx`` without memory a place in one new buffer of ``backend``
    (ggml_backend_alloc_ctx_tensors). Returns the buffer, or None when nothing needed memory."""
    if not isinstance(ctx, Context):
        raise DTypeError(f"ggml_backend_alloc_ctx_tensors: expected a Context, got "
                         f"{type(ctx).__name__}")
    if not isinstance(backend, Backend):
        raise DTypeError(f"ggml_backend_alloc_ctx_tensors: expected a Backend, got "
                         f"{type(backend).__name__}")
    todo = [t for t in ctx.tensors if t.buffer is None and t.view_src is None]
    offsets = []
    size = 0
    for t in todo:
        offsets.append(size)
        size += align(max(t.nbytes(), 1))
    buf = backend.alloc_buffer(size) if todo else None
    for t, off in zip(todo, offsets):
        t.buffer, t.offset = buf, off
    for t in ctx.tensors:
        if t.view_src is not None and t.buffer is None and t.view_src.buffer is not None:
            init_view(t)
    return buf


def _compute_lock(t: Tensor) -> contextlib.AbstractContextManager[object]:
    """The lock of the scheduler whose compute memory holds ``t``, or a no-op."""
    lock = buffer_of(t).lock
    return lock if lock is not None else contextlib.nullcontext()


def tensor_set(t: Tensor, array: npt.ArrayLike) -> None:
    """Copy ``array`` (same element count and dtype) into ``t`` (ggml_backend_tensor_set)."""
    _check_transfer(t)
    with _compute_lock(t):
        _check_transfer(t)  # again: another thread may have reset the scheduler meanwhile
        buffer_of(t).backend.tensor_set(t, array)


def tensor_fill(t: Tensor, value: float) -> None:
    """Set every element of ``t`` to ``value`` in place (ggml_backend_tensor_memset, for any
    value): no host array is made."""
    _check_transfer(t)
    with _compute_lock(t):
        _check_transfer(t)
        buffer_of(t).fill(t, value)


def tensor_get(t: Tensor) -> np.ndarray:
    """A host copy of ``t``'s data in NumPy order (ggml_backend_tensor_get)."""
    _check_transfer(t)
    with _compute_lock(t):
        _check_transfer(t)
        return buffer_of(t).backend.tensor_get(t)


def cupy_init(device: int = 0) -> Backend:
    """The CuPy (CUDA) backend on GPU ``device``.

    Raises BackendUnavailableError without CuPy or a usable GPU.
    """
    from .cuda.backend import CuPyBackend

    return CuPyBackend(device)
