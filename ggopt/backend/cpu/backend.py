"""The CPU backend: host buffers (NumPy arrays) and nodes compiled to Cython kernel calls.

Matrix products go to BLAS sgemm (SciPy's, one thread per call, spread over the kernels' thread
count: ``ops/linalg.py``); everything else is a ``ggopt._kernels`` function.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ...tensor import VIEW_OPS, Tensor
from ..base import Backend, Placement, Step
from ..buffer import ALIGNMENT, Buffer
from ..fusion import is_product_then_add, is_product_then_sum
from ..profile import timed
from . import threads as _threads
from .blas import SerialBlas
from .denormals import ComputeFloatMode
from .ops import COMPILERS
from .ops.linalg import product_then_add_step

__all__ = ["CPUBackend", "cpu_init", "host_backend"]


class CPUBackend(Backend):
    """Computes on the host with the OpenMP kernels (ggml_backend_cpu).

    ``n_threads`` None follows the process-wide :func:`ggopt.set_n_threads` setting.
    """

    name = "CPU"
    is_host = True
    steps_bind_memory = True  # every compiler in ops/ binds arrays only

    def __init__(self, n_threads: int | None = None) -> None:
        self._n_threads = _check_n_threads("ggml_backend_cpu_init", n_threads)

    @property
    def n_threads(self) -> int:
        return self._n_threads if self._n_threads is not None else _threads.get_n_threads()

    def set_n_threads(self, n_threads: int | None) -> None:
        """Pin this backend's thread count (None: follow the process-wide setting)."""
        self._n_threads = _check_n_threads("ggml_backend_cpu_set_n_threads", n_threads)

    def compute_scope(self) -> AbstractContextManager[object]:
        """BLAS on one thread (:class:`.blas.SerialBlas`) and the compute's float mode
        (:class:`.denormals.ComputeFloatMode`, flush-to-zero on this backend's threads), one
        scope whose float mode is set and restored in C, so no interrupt leaves it set."""
        scope: AbstractContextManager[object] = ComputeFloatMode(self.n_threads, SerialBlas())
        return scope

    # --- memory -------------------------------------------------------------------------------
    def _alloc(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGNMENT
        return raw[start:start + nbytes]

    def array_at(self, buf: Buffer, offset: int, t: Tensor) -> Any:
        shape = t.storage_shape()
        if 0 in t.ne:
            return np.empty(shape, dtype=t.type.dtype)
        return np.ndarray(shape, dtype=t.type.dtype, buffer=buf.data, offset=offset,
                          strides=t.storage_strides())

    def _copy_in(self, t: Tensor, array: np.ndarray) -> None:
        view = t.array4d()
        np.copyto(view, array.reshape(view.shape))

    def _copy_out(self, t: Tensor) -> np.ndarray:
        return np.array(t.numpy(), copy=True)

    def fill(self, t: Tensor, value: float) -> None:
        t.array4d()[...] = value

    def can_read(self, buf: Buffer) -> bool:
        return buf.is_host

    # --- compute ------------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> bool:
        return node.op in VIEW_OPS or node.op in COMPILERS

    def compile_node(self, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step | None:
        if node.op in VIEW_OPS or node.nelements() == 0:  # nothing to compute or write
            return None
        return COMPILERS[node.op](self, node, srcs, mem)

    def compile_nodes(self, nodes: list[Tensor], srcs_of: Mapping[Tensor, tuple[Tensor, ...]],
                      mem: Placement, uses: Mapping[Tensor, int]) -> list[Step]:
        """As the base class, but a product followed by the add that sums it into a gradient
        accumulator, or into a tensor whose memory the add's result took over, is one step
        (``backend/fusion.py``). Each step is timed while a :class:`..profile.NodeTimes` is
        active."""
        steps: list[Step] = []
        i = 0
        while i < len(nodes):
            node = nodes[i]
            nxt = nodes[i + 1] if i + 1 < len(nodes) else None
            acc = None if nxt is None or node.nelements() == 0 else \
                _sum_target(node, nxt, srcs_of[nxt], mem, uses)
            if acc is not None:
                fused = product_then_add_step(self, node, srcs_of[node], mem, acc)
                if fused is not None:
                    steps.append(timed(fused, (node, nodes[i + 1])))
                    i += 2
                    continue
            step = self.compile_node(node, srcs_of[node], mem)
            if step is not None:
                steps.append(timed(step, (node,)))
            i += 1
        return steps

    def copy_step(self, src: Tensor, dst: Tensor, mem: Placement) -> Step:
        backend = mem.at(src.data_owner())[0].backend
        out = mem(dst)

        def step() -> None:
            np.copyto(out, backend.tensor_get(src).reshape(out.shape))

        return step


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` are the same elements of the same memory."""
    return a.shape == b.shape and a.strides == b.strides and \
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _sum_target(prod: Tensor, add: Tensor, add_srcs: tuple[Tensor, ...], mem: Placement,
                uses: Mapping[Tensor, int]) -> np.ndarray | None:
    """The array ``prod`` may be summed into as one step with ``add`` (``add``'s result, which
    holds the other operand's values when the product runs), or None."""
    if is_product_then_add(prod, add, uses):
        return mem(add) if add_srcs[0] is add.src[0] else None
    j = is_product_then_sum(prod, add, uses)
    if j is None or add_srcs[j] is not add.src[j]:
        return None
    out = mem(add)
    return out if _same_memory(out, mem(add.src[j])) else None


def _check_n_threads(fn: str, n: object) -> int | None:
    """None (follow the process-wide setting) or a count in ``[1, MAX_N_THREADS]``."""
    return None if n is None else _threads.check_n_threads(n, fn)


_HOST: CPUBackend | None = None


def host_backend() -> CPUBackend:
    """The shared CPU backend that holds host-side data (datasets, no_alloc=False contexts)."""
    global _HOST
    if _HOST is None:
        _HOST = CPUBackend()
    return _HOST


def cpu_init(n_threads: int | None = None) -> CPUBackend:
    """A CPU backend (ggml_backend_cpu_init); ``n_threads`` None follows ggopt.set_n_threads."""
    return CPUBackend(n_threads)
