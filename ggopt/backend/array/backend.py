"""A backend over an array module ``xp`` (NumPy or CuPy): flat byte buffers of that module,
strided views of them, and graph nodes compiled to ``xp`` array code (:mod:`.ops`).

Its memory is device memory as far as the scheduler is concerned (``is_host`` is False, even
over NumPy): tensors on it are read with :func:`ggopt.backend.tensor_get`, and every input that
lives on another backend is copied in before a split runs. Over NumPy it is a reference
backend that makes a CPU-only machine exercise real splits and copies
(:func:`numpy_backend`); :class:`ggopt.backend.cuda.backend.CuPyBackend` puts it on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

import numpy as np

from ...errors import DTypeError
from ...tensor import VIEW_OPS, Op, Tensor
from ..base import Backend, Placement, Step
from ..buffer import ALIGNMENT, Buffer
from .ops import COMPILERS, Compiler

__all__ = ["ArrayBackend", "numpy_backend"]


class ArrayBackend(Backend):
    """Computes with the array module ``xp`` (ggml_backend over NumPy or CuPy arrays).

    Parameters
    ----------
    xp : module
        ``numpy`` here; subclasses pass another module with NumPy's API (``cupy``).
    name : str
        Shown in reprs and in the names of split-input copies.
    ops : iterable of Op, optional
        Restrict the ops this backend claims in :meth:`supports_op` (views always); None
        claims every op it can compute.
    """

    is_host = False

    def __init__(self, xp: ModuleType = np, name: str = "NumPy",
                 ops: Iterable[Op] | None = None) -> None:
        if not isinstance(name, str):
            raise DTypeError(f"ArrayBackend: name must be a str, got {type(name).__name__}")
        claimed = None
        if ops is not None:
            claimed = frozenset(ops)
            bad = [o for o in claimed if not isinstance(o, Op)]
            if bad:
                raise DTypeError(f"ArrayBackend: ops must be ggopt.Op members, got {bad[0]!r}")
        self.xp = xp
        self.name = name
        self.ops = claimed
        #: The device ordinal of the memory (None: host RAM seen as a device).
        self.device: int | None = None
        self._compilers: dict[Op, Compiler] = dict(COMPILERS)

    # --- array-module hooks (NumPy here; CuPyBackend overrides them) ----------------------
    def _alloc(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGNMENT
        return raw[start:start + nbytes]

    def _bytes_view(self, data: Any, offset: int, shape: tuple[int, ...],
                    strides: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return np.ndarray(shape, dtype=dtype, buffer=data, offset=offset, strides=strides)

    def to_host(self, arr: Any) -> np.ndarray:
        """A host (NumPy) copy of the array ``arr`` of this backend."""
        return np.array(arr, copy=True)

    def from_host(self, dst: Any, host: np.ndarray) -> None:
        """Write the host array ``host`` (``dst``'s element count) into ``dst``."""
        np.copyto(dst, host.reshape(dst.shape), casting="unsafe")

    def scatter_add(self, dst: Any, idx: Any, src: Any) -> None:
        """``dst[idx[i]] += src[i]`` for every ``i``, repeated indices accumulating."""
        np.add.at(dst, idx, src)

    def _wrap(self, step: Step) -> Step:
        def quiet() -> None:
            with np.errstate(all="ignore"):  # inf/NaN are results here, as in ggml
                step()

        return quiet

    # --- memory -------------------------------------------------------------------------------
    def view_bytes(self, buf: Buffer, offset: int, shape: tuple[int, ...],
                   strides: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """An ``xp`` array of ``shape``/``strides`` (bytes) over ``buf`` from byte ``offset``."""
        if 0 in shape:
            return self.xp.empty(shape, dtype=dtype)
        return self._bytes_view(buf.data, offset, shape, strides, dtype)

    def array_at(self, buf: Buffer, offset: int, t: Tensor) -> Any:
        return self.view_bytes(buf, offset, t.storage_shape(), t.storage_strides(), t.type.dtype)

    def _copy_in(self, t: Tensor, array: np.ndarray) -> None:
        self.from_host(t.array4d(), array)

    def _copy_out(self, t: Tensor) -> np.ndarray:
        return self.to_host(t.array4d()).reshape(t.shape[:-1] + t.storage_shape()[-1:])

    def fill(self, t: Tensor, value: float) -> None:
        t.array4d()[...] = value

    def _same_memory_space(self, other: Backend) -> bool:
        return (isinstance(other, ArrayBackend) and other.xp is self.xp
                and other.device == self.device)

    # --- compute ------------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> bool:
        if node.op in VIEW_OPS:
            return True
        return node.op in self._compilers and (self.ops is None or node.op in self.ops)

    def compile_node(self, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step | None:
        if node.op in VIEW_OPS or node.nelements() == 0:  # nothing to compute or write
            return None
        return self._wrap(self._compilers[node.op](self, node, srcs, mem))

    def copy_step(self, src: Tensor, dst: Tensor, mem: Placement) -> Step:
        out = mem(dst)
        src_buf = mem.at(src)[0]
        backend = src_buf.backend
        if src_buf.is_host:
            host = mem(src)
            return self._wrap(lambda: self.from_host(out, host))
        if self._same_memory_space(backend):
            arr = mem(src)

            def step() -> None:
                out[...] = arr

            return self._wrap(step)
        return self._wrap(lambda: self.from_host(out, backend.tensor_get(src)))


def numpy_backend(ops: Iterable[Op] | None = None) -> ArrayBackend:
    """A NumPy :class:`ArrayBackend`: a non-host reference backend for scheduler tests.

    ``ops`` restricts the ops it claims (None: all), so graphs split between it and the CPU.
    """
    return ArrayBackend(np, "NumPy", ops)
