"""The backend interface: what the scheduler needs from a device (ggml_backend)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DTypeError, OutOfMemoryError, ShapeError, StateError
from ..tensor import Tensor
from .buffer import Buffer, buffer_of, check_writable

__all__ = ["Backend", "Placement", "Step", "check_row_indices"]

#: A compiled node: a zero-argument callable that computes it into its memory.
Step = Callable[[], None]


class Placement:
    """Where tensors' memory is while a graph is compiled: the scheduler's map from tensor to
    ``(buffer, byte offset)``; tensors outside the map use the memory they already have, views
    their source's.

    Compilers read arrays through it (``mem(t)``), so compiling never writes ``t.buffer``.
    """

    __slots__ = ("_at",)

    def __init__(self, at: Mapping[Tensor, tuple[Buffer, int]] | None = None) -> None:
        self._at = at if at is not None else {}

    def at(self, t: Tensor) -> tuple[Buffer, int]:
        """``(buffer, byte offset)`` of ``t``; StateError when it has no memory."""
        loc = self._at.get(t)
        if loc is not None:
            return loc
        if t.buffer is not None:
            return buffer_of(t), t.offset
        if t.view_src is not None:
            buf, off = self.at(t.view_src)
            return buf, off + t.view_offs
        raise StateError(f"tensor '{t.name}' has no memory in this graph's plan")

    def has_memory(self, t: Tensor) -> bool:
        try:
            self.at(t)
        except StateError:
            return False
        return True

    def __call__(self, t: Tensor) -> Any:
        """The 4-D backend array (NumPy order) of ``t``."""
        buf, off = self.at(t)
        return buf.backend.array_at(buf, off, t)


class Backend:
    """Base class of backends. Subclasses fill in the primitive hooks; this class validates.

    A backend owns buffers, can view a tensor's memory as an array, copy to and from host
    NumPy arrays, and compile graph nodes into zero-argument callables.
    """

    name = "backend"
    #: True when buffers are host RAM (NumPy arrays), so tensors there have a NumPy view.
    is_host = False
    #: True when every step :meth:`compile_node` returns reads and writes only the arrays that
    #: the placement gave it (never a tensor object), so that the scheduler may run the same
    #: steps for another graph of the same structure and memory (see ``plan_cache``).
    steps_bind_memory = False

    # --- hooks --------------------------------------------------------------------------------
    def _alloc(self, nbytes: int) -> Any:
        raise NotImplementedError("need _alloc")

    def array_at(self, buf: Buffer, offset: int, t: Tensor) -> Any:
        """The 4-D array (NumPy order) of ``t``'s shape and strides in ``buf`` from byte
        ``offset``."""
        raise NotImplementedError("need array_at")

    def _copy_in(self, t: Tensor, array: np.ndarray) -> None:
        raise NotImplementedError("need _copy_in")

    def _copy_out(self, t: Tensor) -> np.ndarray:
        raise NotImplementedError("need _copy_out")

    def fill(self, t: Tensor, value: float) -> None:
        raise NotImplementedError("need fill")

    def supports_op(self, node: Tensor) -> bool:
        """True when this backend can compute ``node``."""
        raise NotImplementedError("need supports_op")

    def can_read(self, buf: Buffer) -> bool:
        """True when kernels of this backend can read tensors that live in ``buf`` directly."""
        return buf.backend is self

    def compile_node(self, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step | None:
        """A callable that computes ``node`` from ``srcs`` (its sources, or copies of them on
        this backend), their memory given by ``mem``; None for ops that compute nothing."""
        raise NotImplementedError("need compile_node")

    def compile_nodes(self, nodes: list[Tensor], srcs_of: Mapping[Tensor, tuple[Tensor, ...]],
                      mem: Placement, uses: Mapping[Tensor, int]) -> list[Step]:
        """The steps of a run of ``nodes`` (in order) on this backend; ``uses`` counts how often
        the whole graph reads each tensor. Backends that fuse nodes override this."""
        steps = [self.compile_node(node, srcs_of[node], mem) for node in nodes]
        return [s for s in steps if s is not None]

    def copy_step(self, src: Tensor, dst: Tensor, mem: Placement) -> Step:
        """A callable that copies ``src`` (on any backend) into ``dst`` (on this backend)."""
        raise NotImplementedError("need copy_step")

    def synchronize(self) -> None:
        """Wait for queued work to finish (a no-op on the CPU)."""

    def compute_scope(self) -> AbstractContextManager[object]:
        """What holds around every graph compute of a scheduler that has this backend (the
        device's own policies: the CPU's BLAS threads and float mode). Default: nothing."""
        return nullcontext()

    # --- public, validated ----------------------------------------------------------------
    def alloc_buffer(self, nbytes: int) -> Buffer:
        """A new buffer of ``nbytes`` bytes (ggml_backend_alloc_buffer)."""
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ShapeError(f"buffer size must be a non-negative int, got {nbytes!r}")
        try:
            data = self._alloc(int(nbytes))
        except (MemoryError, ValueError, OverflowError) as exc:  # NumPy/CuPy refusals
            raise OutOfMemoryError(f"ggml_backend_alloc_buffer: {self.name} could not allocate "
                                   f"{int(nbytes)} bytes ({type(exc).__name__}: {exc})") from None
        return Buffer(self, int(nbytes), data)

    def tensor_set(self, t: Tensor, array: npt.ArrayLike) -> None:
        _check_transfer(t)
        check_writable("ggml_backend_tensor_set", t)
        arr = np.asarray(array)
        if arr.dtype != t.type.dtype:
            raw = " raw blocks" if t.type.is_quantized else ""
            raise DTypeError(f"ggml_backend_tensor_set: tensor '{t.name}' is {t.type.name} "
                             f"({t.type.dtype}{raw}), the array is {arr.dtype}")
        if t.type.is_quantized:
            want = int(np.prod(t.storage_shape()))
            if arr.size != want:
                raise ShapeError(f"ggml_backend_tensor_set: tensor '{t.name}' is {t.type.name} "
                                 f"with {want} bytes of blocks, the uint8 array has {arr.size}")
        elif arr.size != t.nelements():
            raise ShapeError(f"ggml_backend_tensor_set: tensor '{t.name}' has {t.nelements()} "
                             f"elements, the array {arr.size}")
        self._copy_in(t, arr)

    def tensor_get(self, t: Tensor) -> np.ndarray:
        _check_transfer(t)
        return self._copy_out(t)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def _check_transfer(t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise DTypeError(f"expected a Tensor, got {type(t).__name__}")
    if t.buffer is None:
        raise StateError(f"tensor '{t.name}' has no memory; allocate its context or graph first")


def check_row_indices(fn: str, idx: Any, nrows: int) -> None:
    """Raise ShapeError unless every index in ``idx`` (any array module) is in ``[0, nrows)``."""
    if idx.size and bool(((idx < 0) | (idx >= nrows)).any()):
        raise ShapeError(f"ggml_{fn}: row index out of range: indices span "
                         f"[{int(idx.min())}, {int(idx.max())}], the source has {nrows} rows")
