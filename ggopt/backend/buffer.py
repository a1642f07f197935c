"""Backend buffers: one block of memory that tensors point into by byte offset."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tensor import Tensor

if TYPE_CHECKING:
    from .base import Backend

__all__ = ["Buffer", "ALIGNMENT", "align", "fill_tensor", "init_view"]

#: Byte alignment of every tensor placed in a buffer (a cache line; enough for AVX-512).
ALIGNMENT = 64


def align(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGNMENT`."""
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class Buffer:
    """A block of ``size`` bytes owned by ``backend`` (ggml_backend_buffer).

    ``data`` is the backend's array object (a NumPy uint8 array for host buffers). ``lock`` is
    the lock of the scheduler whose compute memory this is (None for other buffers):
    ``tensor_get``/``tensor_set`` hold it, so they never read or write while it computes.
    """

    __slots__ = ("backend", "size", "data", "is_host", "lock", "__weakref__")

    def __init__(self, backend: Backend, size: int, data) -> None:
        self.backend = backend
        self.size = size
        self.data = data
        self.is_host = backend.is_host
        self.lock = None

    def view(self, t: Tensor):
        """The 4-D array (NumPy order) of tensor ``t``, which must point into this buffer."""
        return self.backend.array_view(self, t)

    def __repr__(self) -> str:
        return f"Buffer({self.backend.name}, {self.size} bytes)"


def init_view(t: Tensor) -> None:
    """Point a view at its source's memory (ggml_backend_view_init)."""
    src = t.view_src
    t.buffer = src.buffer
    t.offset = src.offset + t.view_offs


def fill_tensor(t: Tensor, value: float) -> None:
    """Set every element of ``t`` to ``value`` on whatever backend holds it."""
    t.buffer.backend.fill(t, value)
