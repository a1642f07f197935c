"""Backend buffers: one block of memory that tensors point into by byte offset."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..errors import StateError
from ..tensor import Tensor

if TYPE_CHECKING:
    from .base import Backend

__all__ = ["Buffer", "ALIGNMENT", "align", "buffer_of", "check_writable", "init_view"]

#: Byte alignment of every tensor placed in a buffer (a cache line; enough for AVX-512).
ALIGNMENT = 64


def align(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGNMENT`."""
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class Buffer:
    """A block of ``size`` bytes owned by ``backend`` (ggml_backend_buffer).

    ``data`` is the backend's array object (a NumPy uint8 array for host buffers; a read-only
    one, such as a mapping of a file opened for reading, makes the buffer ``read_only``).
    ``lock`` is the lock of the scheduler whose compute memory this is (None for other buffers):
    ``tensor_get``/``tensor_set`` hold it, so they never read or write while it computes.
    """

    __slots__ = ("backend", "size", "data", "is_host", "read_only", "lock", "__weakref__")

    def __init__(self, backend: Backend, size: int, data: Any) -> None:
        self.backend = backend
        self.size = size
        self.data = data
        self.is_host = backend.is_host
        flags = getattr(data, "flags", None)
        self.read_only = flags is not None and not getattr(flags, "writeable", True)
        self.lock: contextlib.AbstractContextManager[Any] | None = None

    def view(self, t: Tensor) -> Any:
        """The 4-D array (NumPy order) of tensor ``t``, which must point into this buffer."""
        return self.backend.array_at(self, t.offset, t)

    def fill(self, t: Tensor, value: float) -> None:
        """Set every element of ``t`` (which points into this buffer) to ``value``."""
        check_writable("ggml_backend_tensor_memset", t)
        self.backend.fill(t, value)

    def __repr__(self) -> str:
        return f"Buffer({self.backend.name}, {self.size} bytes)"


def buffer_of(t: Tensor) -> Buffer:
    """The buffer ``t`` points into (the core sees it as :class:`ggopt.tensor.Memory`)."""
    buf = t.buffer
    if buf is None:
        raise StateError(f"tensor '{t.name}' has no memory; allocate its context or graph first")
    if not isinstance(buf, Buffer):
        raise StateError(f"tensor '{t.name}' points into {type(buf).__name__}, not a Buffer")
    return buf


def check_writable(fn: str, t: Tensor) -> None:
    """StateError unless ``t``'s memory may be written (not a read-only mapping)."""
    if buffer_of(t).read_only:
        raise StateError(f"{fn}: tensor '{t.name}' lives in read-only memory (a mapped file's "
                         "bytes); it can be read, not written: copy it into a tensor of its own")


def init_view(t: Tensor) -> None:
    """Point a view at its source's memory (ggml_backend_view_init)."""
    src = t.view_src
    if src is not None:
        t.buffer = src.buffer
        t.offset = src.offset + t.view_offs

