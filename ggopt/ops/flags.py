"""Tensor flags and names: set_input, set_output, set_param, set_loss, set_name, get_name."""

from __future__ import annotations

from ..errors import DTypeError, ShapeError
from ..tensor import Op, Tensor
from ..types import F32, FLAG_INPUT, FLAG_LOSS, FLAG_OUTPUT, FLAG_PARAM
from ._base import check_tensor, ne_str

__all__ = ["set_input", "set_output", "set_param", "set_loss", "set_name", "get_name"]


def set_input(t: Tensor) -> None:
    """Flag ``t`` as a graph input: allocated first, never overwritten (ggml_set_input)."""
    check_tensor("set_input", "t", t).flags |= FLAG_INPUT


def set_output(t: Tensor) -> None:
    """Flag ``t`` (and the tensors it views) as an output: kept readable after compute."""
    node: Tensor | None = check_tensor("set_output", "t", t)
    while node is not None:
        node.flags |= FLAG_OUTPUT
        node = node.view_src


def set_param(t: Tensor) -> None:
    """Flag ``t`` as a trainable parameter (ggml_set_param); it must not be an op result."""
    check_tensor("set_param", "t", t)
    if t.op is not Op.NONE:
        raise ShapeError(f"ggml_set_param: tensor '{t.name}' is the result of op {t.op.name}; "
                         "only tensors created directly in a context can be parameters")
    if t.type.is_quantized:
        raise DTypeError(f"ggml_set_param: tensor '{t.name}' is {t.type.name}: a quantized "
                         "tensor cannot be trained (ggml aborts); train an F32 copy or adapters")
    t.flags |= FLAG_PARAM


def set_loss(t: Tensor) -> None:
    """Flag ``t`` as the loss to minimise (ggml_set_loss); it must be a scalar F32."""
    check_tensor("set_loss", "t", t)
    if not t.is_scalar() or t.type is not F32:
        raise ShapeError(f"ggml_set_loss: the loss must be a scalar F32 tensor, got "
                         f"{t.type.name} ne={ne_str(t)}")
    t.flags |= FLAG_LOSS


def set_name(t: Tensor, name: str) -> Tensor:
    """Name ``t`` (ggml_set_name) and return it."""
    check_tensor("set_name", "t", t)
    if not isinstance(name, str):
        raise DTypeError(f"ggml_set_name: name must be a str, got {type(name).__name__}")
    t.name = name
    return t


def get_name(t: Tensor) -> str:
    return check_tensor("get_name", "t", t).name
