"""The tensor node: ggml's ``struct ggml_tensor`` as a Python object.

A tensor is metadata (type, ``ne``, ``nb``, op, sources, flags, name) plus, once it has memory, a
backend buffer and a byte offset into it. Shapes are ggml's: ``ne[0]`` varies fastest; the NumPy
view of a tensor has shape ``(ne3, ne2, ne1, ne0)`` trimmed to :attr:`Tensor.n_dims`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .errors import StateError
from .types import FLAG_PARAM, GGML_MAX_DIMS, GGType, TensorFlag

if TYPE_CHECKING:
    from .context import Context

__all__ = ["Op", "UnaryOp", "Tensor", "VIEW_OPS", "Memory"]


class Op(enum.Enum):
    """Graph operations (ggml's ``enum ggml_op`` names)."""

    # members are singletons compared by identity: hash them by identity too, in C (Enum's
    # own __hash__ is a Python function, and every op lookup in a registry pays for it)
    __hash__ = object.__hash__

    NONE = "none"
    DUP = "dup"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    SQR = "sqr"
    SQRT = "sqrt"
    LOG = "log"
    SUM = "sum"
    SUM_ROWS = "sum_rows"
    MEAN = "mean"
    ARGMAX = "argmax"
    COUNT_EQUAL = "count_equal"
    REPEAT = "repeat"
    REPEAT_BACK = "repeat_back"
    ACC = "acc"
    SCALE = "scale"
    CPY = "cpy"
    CONT = "cont"
    RESHAPE = "reshape"
    VIEW = "view"
    PERMUTE = "permute"
    TRANSPOSE = "transpose"
    GET_ROWS = "get_rows"
    GET_ROWS_BACK = "get_rows_back"
    SOFT_MAX = "soft_max"
    SOFT_MAX_BACK = "soft_max_back"
    IM2COL = "im2col"
    IM2COL_BACK = "im2col_back"
    POOL_2D = "pool_2d"
    POOL_2D_BACK = "pool_2d_back"
    CONV_2D = "conv_2d"
    CONV_2D_BACK_INPUT = "conv_2d_back_input"
    CONV_2D_BACK_KERNEL = "conv_2d_back_kernel"
    MUL_MAT = "mul_mat"
    OUT_PROD = "out_prod"
    UNARY = "unary"
    UNARY_BACK = "unary_back"
    CROSS_ENTROPY_LOSS = "cross_entropy_loss"
    CROSS_ENTROPY_LOSS_BACK = "cross_entropy_loss_back"
    CROSS_ENTROPY_LOSS_IDS = "cross_entropy_loss_ids"  # ggopt's own: labels as class ids
    CROSS_ENTROPY_LOSS_IDS_BACK = "cross_entropy_loss_ids_back"
    OPT_STEP_ADAMW = "opt_step_adamw"
    OPT_STEP_SGD = "opt_step_sgd"
    ADD1 = "add1"
    SIN = "sin"
    COS = "cos"
    CONCAT = "concat"
    NORM = "norm"
    NORM_BACK = "norm_back"
    RMS_NORM = "rms_norm"
    RMS_NORM_BACK = "rms_norm_back"
    DIAG_MASK_INF = "diag_mask_inf"
    DIAG_MASK_ZERO = "diag_mask_zero"
    ROPE = "rope"
    ROPE_BACK = "rope_back"
    GLU = "glu"


class UnaryOp(enum.Enum):
    """Element-wise functions behind ``Op.UNARY`` (ggml's ``enum ggml_unary_op`` names)."""

    __hash__ = object.__hash__  # as Op's

    ABS = "abs"
    NEG = "neg"
    STEP = "step"
    TANH = "tanh"
    RELU = "relu"
    SIGMOID = "sigmoid"
    GELU = "gelu"
    SILU = "silu"
    EXP = "exp"


#: Ops whose result shares its source's memory and that compute nothing.
VIEW_OPS = frozenset({Op.NONE, Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE})
#: Positions of the sources an op writes in place besides its own result (itself a view of
#: the source it updates): AdamW's moments.
WRITTEN_SOURCES = {Op.OPT_STEP_ADAMW: (2, 3)}


class _Named(Protocol):
    name: str


class Memory(Protocol):
    """What a tensor needs from the block of memory it points into (a backend buffer); the
    core never imports the backends, it only calls this interface."""

    @property
    def is_host(self) -> bool:
        """True for host RAM, where a NumPy view of the tensor is possible."""

    @property
    def backend(self) -> _Named:
        """The owner of the memory (its ``name`` is shown in messages)."""

    def view(self, t: Tensor) -> Any:
        """The 4-D array (NumPy order) of ``t`` in this memory."""

    def fill(self, t: Tensor, value: float) -> None:
        """Set every element of ``t`` to ``value``."""


class Tensor:
    """A node of a computation graph (ggml_tensor).

    Create tensors through a :class:`~ggopt.Context` or an op function, never directly.
    """

    __slots__ = (
        "ctx",
        "type",
        "ne",
        "nb",
        "op",
        "op_params",
        "src",
        "flags",
        "name",
        "view_src",
        "view_offs",
        "buffer",
        "offset",
        "__weakref__",
    )

    def __init__(
        self,
        ctx: Context,
        type: GGType,
        ne: tuple[int, int, int, int],
        nb: tuple[int, int, int, int] | None = None,
        op: Op = Op.NONE,
        src: tuple[Tensor, ...] = (),
        op_params: object = None,
        view_src: Tensor | None = None,
        view_offs: int = 0,
    ) -> None:
        self.ctx = ctx
        self.type = type
        self.ne = ne
        self.nb = nb if nb is not None else contiguous_strides(type, ne)
        self.op = op
        self.op_params = op_params
        self.src = src
        #: the :class:`TensorFlag` bits, as a plain int (ggml's ``int32_t flags``)
        self.flags = 0
        self.name = ""
        self.view_src = view_src
        self.view_offs = view_offs
        self.buffer: Memory | None = None
        self.offset = 0

    # --- shape helpers -------------------------------------------------------------------
    def nelements(self) -> int:
        """Number of elements (ggml_nelements)."""
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    def nrows(self) -> int:
        """Number of rows of ``ne[0]`` elements (ggml_nrows)."""
        return self.ne[1] * self.ne[2] * self.ne[3]

    def nbytes(self) -> int:
        """Bytes spanned by the tensor's memory (ggml_nbytes)."""
        if self.nelements() == 0:
            return 0
        blck = _BLCK[self.type]
        if blck == 1:
            size = self.type.size
            for i in range(GGML_MAX_DIMS):
                size += (self.ne[i] - 1) * self.nb[i]
            return size
        size = self.ne[0] * self.nb[0] // blck  # whole rows of blocks
        for i in range(1, GGML_MAX_DIMS):
            size += (self.ne[i] - 1) * self.nb[i]
        return size

    @property
    def n_dims(self) -> int:
        """Number of dimensions, ignoring trailing dimensions of size 1 (ggml_n_dims)."""
        for i in range(GGML_MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def shape(self) -> tuple[int, ...]:
        """The NumPy shape: ``ne`` reversed, without trailing dimensions of size 1.

        Like :attr:`n_dims`, except that a dimension of size 0 is kept: ``ne=[4, 0]`` is
        ``(0, 4)`` (ggml's n_dims says 1, which would hide that the tensor is empty).
        """
        return tuple(reversed(self.ne[: _numpy_ndim(self.ne)]))

    def is_contiguous(self) -> bool:
        """True when the elements are densely packed in ggml order (ggml_is_contiguous)."""
        return self.nb == contiguous_strides(self.type, self.ne) or self.nelements() <= 1

    def storage_shape(self) -> tuple[int, int, int, int]:
        """The 4-D NumPy shape of the memory view: ``(ne3, ne2, ne1, ne0)``, or for a quantized
        type ``(ne3, ne2, ne1, row bytes)``: its rows of raw blocks, ``uint8``."""
        ne = self.ne
        blck = _BLCK[self.type]
        if blck == 1:
            return (ne[3], ne[2], ne[1], ne[0])
        return (ne[3], ne[2], ne[1], ne[0] // blck * self.type.size)

    def storage_strides(self) -> tuple[int, int, int, int]:
        """The byte strides of :meth:`storage_shape` (NumPy order)."""
        nb = self.nb
        return (nb[3], nb[2], nb[1], nb[0] if _BLCK[self.type] == 1 else 1)

    def is_transposed(self) -> bool:
        """True when dims 0 and 1 are swapped in memory (ggml_is_transposed)."""
        return self.nb[0] > self.nb[1]

    def is_scalar(self) -> bool:
        return self.ne == (1, 1, 1, 1)

    def is_vector(self) -> bool:
        return self.ne[1] == 1 and self.ne[2] == 1 and self.ne[3] == 1

    def is_matrix(self) -> bool:
        return self.ne[2] == 1 and self.ne[3] == 1

    def same_shape(self, other: Tensor) -> bool:
        return self.ne == other.ne

    # --- flags ---------------------------------------------------------------------------
    def has_flag(self, flag: TensorFlag | int) -> bool:
        return bool(self.flags & flag)

    @property
    def is_param(self) -> bool:
        return bool(self.flags & FLAG_PARAM)

    # --- memory --------------------------------------------------------------------------
    @property
    def is_host(self) -> bool:
        """True when the tensor has memory in host RAM (a NumPy view is possible)."""
        return self.buffer is not None and self.buffer.is_host

    def data_owner(self) -> Tensor:
        """The tensor that owns this tensor's memory (follows ``view_src``)."""
        return self.view_src if self.view_src is not None else self

    def array4d(self) -> Any:
        """The backend array of the tensor's memory, 4-D in NumPy order ``(ne3, ne2, ne1, ne0)``."""
        if self.buffer is None:
            raise StateError(
                f"tensor '{self.name}' has no memory yet: allocate its context "
                "(backend.alloc_ctx_tensors) or its graph (Scheduler.alloc_graph) first"
            )
        return self.buffer.view(self)

    def numpy(self) -> np.ndarray:
        """A zero-copy NumPy view of the tensor's memory, shape :attr:`shape`.

        Raises :class:`~ggopt.errors.StateError` when the tensor has no memory yet or its
        memory is not host RAM (use :func:`ggopt.backend.tensor_get` for device tensors).
        """
        if self.buffer is not None and not self.buffer.is_host:
            raise StateError(
                f"tensor '{self.name}' lives on backend {self.buffer.backend.name}; "
                "use ggopt.backend.tensor_get(t) to copy it to the host"
            )
        view: np.ndarray = self.array4d()[(0,) * (GGML_MAX_DIMS - _numpy_ndim(self.ne))]
        return view

    def __repr__(self) -> str:
        dims = ", ".join(str(n) for n in self.ne[: self.n_dims])
        return f"Tensor('{self.name}', {self.type.name}, ne=[{dims}], op={self.op.name})"


def _numpy_ndim(ne: tuple[int, int, int, int]) -> int:
    """Dimensions of the NumPy view: up to the last one whose size is not 1."""
    for i in range(GGML_MAX_DIMS - 1, 0, -1):
        if ne[i] != 1:
            return i + 1
    return 1


#: bytes per block by type (GGType.size, without the property and dtype lookups)
_ITEMSIZE = {t: t.size for t in GGType}
#: elements per block by type
_BLCK = {t: t.blck_size for t in GGType}


def contiguous_strides(type: GGType, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """Byte strides of a densely packed tensor of shape ``ne`` (for a quantized type ``nb[0]``
    is the bytes of one block and ``nb[1]`` those of a row, as ggml computes them)."""
    nb0 = _ITEMSIZE[type]
    nb1 = nb0 * (ne[0] // _BLCK[type])
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)
