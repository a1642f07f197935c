"""Validation helpers and the backward registry of the op modules (names as in ggopt.ops)."""

from __future__ import annotations

from typing import TypeVar

from ..errors import DTypeError
from ..ops import BACKWARD, GradSink, backward, can_repeat
from ..ops import _check_tensor as check_tensor
from ..ops import _check_type as check_type
from ..ops import _ctx as check_ctx
from ..ops import _f32 as check_f32
from ..ops import _int as as_int
from ..ops import _ne_str as ne_str
from ..ops import _scalar as as_scalar
from ..tensor import Tensor

__all__ = ["BACKWARD", "GradSink", "as_int", "as_scalar", "backward", "can_repeat",
           "check_ctx", "check_f32", "check_tensor", "check_type", "ne_str", "params_of"]

P = TypeVar("P")


def params_of(node: Tensor, kind: type[P]) -> P:
    """``node.op_params``, checked to be a ``kind``."""
    prm = node.op_params
    if not isinstance(prm, kind):
        raise DTypeError(f"{node.op.name}: op_params must be {kind.__name__}, got {prm!r}")
    return prm
