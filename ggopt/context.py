"""Contexts: the owners of tensor metadata (ggml_context)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from .errors import OutOfMemoryError, ShapeError, StateError
from .tensor import Memory, Op, Tensor, contiguous_strides
from .types import GGML_MAX_DIMS, GGType, as_type

__all__ = ["Context", "set_host_allocator"]

#: Gives ``no_alloc=False`` contexts host memory: ``nbytes -> Memory``. The backend layer
#: installs it when it is imported (``ggopt`` imports it), so this module needs no backend.
_host_allocator: Callable[[int], Memory] | None = None


def set_host_allocator(alloc: Callable[[int], Memory]) -> None:
    """Install the function that allocates host memory for ``Context(no_alloc=False)``."""
    global _host_allocator
    _host_allocator = alloc


def normalize_ne(ne: Sequence[int]) -> tuple[int, int, int, int]:
    """Validate a ggml shape of 1-4 non-negative ints and pad it to four dimensions."""
    if not 1 <= len(ne) <= GGML_MAX_DIMS:
        raise ShapeError(f"a tensor has 1 to 4 dimensions, got ne={list(ne)}")
    out = []
    for i, n in enumerate(ne):
        if isinstance(n, bool) or not hasattr(n, "__index__"):
            raise ShapeError(f"ne[{i}] must be an int, got {n!r}")
        n = int(n)
        if n < 0:
            raise ShapeError(f"ne[{i}] must be >= 0, got {n}")
        out.append(n)
    out += [1] * (GGML_MAX_DIMS - len(out))
    return (out[0], out[1], out[2], out[3])


def check_whole_blocks(fn: str, type: GGType, ne: Sequence[int], name: str = "") -> None:
    """ShapeError unless ``ne[0]`` is a whole number of ``type``'s blocks (ggml asserts it)."""
    blck = type.blck_size
    if ne[0] % blck:
        what = f" '{name}'" if name else ""
        raise ShapeError(f"ggml_{fn}: tensor{what} of type {type.name} needs ne[0] to be a "
                         f"multiple of its block size {blck}, got ne={list(ne)}")


class Context:
    """A collection of tensors and the ops built on them (ggml_init / ggml_context).

    Parameters
    ----------
    mem_size:
        With ``no_alloc=False``, the most bytes of tensor data the context may hold
        (None: no limit). Ignored with ``no_alloc=True``, where data lives in backend buffers.
    no_alloc:
        True (the default, as ggml-opt uses it): tensors get memory later, from
        :func:`ggopt.backend.alloc_ctx_tensors` or a scheduler. False: every new tensor gets
        host memory at once.

    ggml: ``ggml_init``.
    """

    def __init__(self, mem_size: int | None = None, no_alloc: bool = True) -> None:
        if mem_size is not None and (not isinstance(mem_size, int) or mem_size < 0):
            raise ShapeError(f"mem_size must be a non-negative int or None, got {mem_size!r}")
        self.mem_size = mem_size
        self.no_alloc = bool(no_alloc)
        self.tensors: list[Tensor] = []
        self._mem_used = 0
        self._freed = False

    # --- creation --------------------------------------------------------------------------
    def _add(self, t: Tensor) -> Tensor:
        if self._freed:
            raise StateError("this context was freed (Context.free); make a new one")
        if not self.no_alloc and t.view_src is None:
            if _host_allocator is None:
                raise StateError("Context(no_alloc=False) needs host memory: import ggopt.backend "
                                 "(import ggopt does) to install the host allocator")
            nbytes = t.nbytes()
            if self.mem_size is not None and self._mem_used + nbytes > self.mem_size:
                raise OutOfMemoryError(
                    f"context is full: tensor needs {nbytes} bytes, "
                    f"{self.mem_size - self._mem_used} of mem_size={self.mem_size} left "
                    "(ggml_new_tensor)"
                )
            buf = _host_allocator(nbytes)
            t.buffer, t.offset = buf, 0
            self._mem_used += nbytes
        elif t.view_src is not None and t.view_src.buffer is not None:
            t.buffer = t.view_src.buffer
            t.offset = t.view_src.offset + t.view_offs
        self.tensors.append(t)
        return t

    def new_tensor(self, type: GGType, ne: Sequence[int]) -> Tensor:
        """A new tensor of element type ``type`` and ggml shape ``ne`` (ne0 fastest)."""
        t = as_type(type)
        ne4 = normalize_ne(ne)
        check_whole_blocks("new_tensor", t, ne4)
        return self._add(Tensor(self, t, ne4))

    def new_tensor_1d(self, type: GGType, ne0: int) -> Tensor:
        return self.new_tensor(type, (ne0,))

    def new_tensor_2d(self, type: GGType, ne0: int, ne1: int) -> Tensor:
        return self.new_tensor(type, (ne0, ne1))

    def new_tensor_3d(self, type: GGType, ne0: int, ne1: int, ne2: int) -> Tensor:
        return self.new_tensor(type, (ne0, ne1, ne2))

    def new_tensor_4d(self, type: GGType, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
        return self.new_tensor(type, (ne0, ne1, ne2, ne3))

    def dup_tensor(self, src: Tensor) -> Tensor:
        """A new tensor with the type and shape of ``src`` (no data copied; ggml_dup_tensor)."""
        return self.new_tensor(src.type, src.ne)

    def new_op(
        self,
        type: GGType,
        ne: tuple[int, int, int, int],
        op: Op,
        src: tuple[Tensor, ...],
        op_params: object = None,
    ) -> Tensor:
        """A new contiguous result tensor of ``op`` (used by the op constructors)."""
        return self._add(Tensor(self, type, ne, None, op, src, op_params))

    def new_view(
        self,
        base: Tensor,
        ne: tuple[int, int, int, int],
        nb: tuple[int, int, int, int] | None,
        offset: int,
        op: Op,
        src: tuple[Tensor, ...],
        op_params: object = None,
        type: GGType | None = None,
    ) -> Tensor:
        """A tensor that shares ``base``'s memory at byte ``offset`` with strides ``nb``."""
        owner = base.data_owner()
        t_type = type or base.type
        t = Tensor(
            self,
            t_type,
            ne,
            nb if nb is not None else contiguous_strides(t_type, ne),
            op,
            src,
            op_params,
            view_src=owner,
            view_offs=base.view_offs + offset if base.view_src is not None else offset,
        )
        return self._add(t)

    def free(self) -> None:
        """Forget the context's tensors (ggml_free); it takes no new ones afterwards.

        Every tensor refers to its context, so a dropped context and its tensors are a cycle
        that only Python's cyclic collector frees, in pauses of up to 0.1 s for a fine-tune
        graph; after ``free`` they go as soon as nothing else holds them. Tensors still held
        elsewhere stay usable (graphs, views and data are untouched).
        """
        self._freed = True
        self.tensors = []

    # --- lookup ----------------------------------------------------------------------------
    def get_tensor(self, name: str) -> Tensor | None:
        """The first tensor called ``name``, or None (ggml_get_tensor)."""
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)
