"""What every op family shares: argument checks, the backward-rule registry and typed params.

A backward rule receives the op's output gradient and sends contributions to the sources that
need them through a :class:`GradSink` (implemented by :mod:`ggopt.graph`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from .._registry import Registry
from ..context import Context
from ..errors import DTypeError, InvalidValueError
from ..tensor import Op, Tensor
from ..types import F32, GGType

__all__ = [
    "BACKWARD", "BackwardRule", "GradSink", "backward", "can_repeat", "check_ctx", "check_f32",
    "check_tensor", "check_type", "ignore_sources", "ignored_sources", "ne_str", "params_of",
    "as_int", "as_scalar", "check_choice",
]


class GradSink(Protocol):
    """Where a backward rule sends gradient contributions (implemented by graph.py)."""

    def needs(self, isrc: int) -> bool:
        """True when source ``isrc`` of the node being differentiated needs a gradient."""

    def add(self, isrc: int, t: Tensor) -> None:
        """Add ``t`` to the gradient of source ``isrc``."""

    def sub(self, isrc: int, t: Tensor) -> None:
        """Subtract ``t`` from the gradient of source ``isrc``."""

    def untile(self, isrc: int, t: Tensor) -> Tensor:
        """``t`` summed over the tiles of source ``isrc`` when the op broadcast that source
        (ggml_repeat_back), else ``t`` itself: a broadcast operand's gradient."""


BackwardRule = Callable[[Context, Tensor, Tensor, GradSink], None]
#: op -> backward rule (``ggml_compute_backward``, one case per op)
BACKWARD: Registry[Op, BackwardRule] = Registry("backward rules")
backward = BACKWARD.register

#: op -> the source indices of a node that never receive gradients (ggml-opt-spec §5.2)
_IGNORED: dict[Op, Callable[[Tensor], frozenset[int]]] = {}


def ignore_sources(op: Op, *isrc: int, when: Callable[[Tensor], bool] | None = None) -> None:
    """Declare that sources ``isrc`` of ``op`` nodes (for which ``when(node)``, if given) never
    receive gradients."""
    ignored = frozenset(isrc)
    none: frozenset[int] = frozenset()
    _IGNORED[op] = (lambda node: ignored) if when is None else (
        lambda node: ignored if when(node) else none)


def ignored_sources(node: Tensor) -> frozenset[int]:
    """Source indices of ``node`` that never receive gradients."""
    rule = _IGNORED.get(node.op)
    return rule(node) if rule is not None else frozenset()


P = TypeVar("P")


def params_of(node: Tensor, kind: type[P]) -> P:
    """``node.op_params``, which must be a ``kind`` (the typed parameters of its op)."""
    p = node.op_params
    if not isinstance(p, kind):
        raise TypeError(f"{node.op.name} node '{node.name}' carries {type(p).__name__} "
                        f"parameters, expected {kind.__name__}")
    return p


# --- argument checks ----------------------------------------------------------------------


def check_tensor(fn: str, name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{fn}: {name} must be a ggopt Tensor, got {type(t).__name__}")
    return t


def check_type(fn: str, name: str, t: object, *types: GGType) -> Tensor:
    t = check_tensor(fn, name, t)
    if t.type not in types:
        want = " or ".join(x.name for x in types)
        raise DTypeError(f"ggml_{fn}: {name} must be {want}, got {t.type.name}")
    return t


def check_f32(fn: str, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        if type(t) is not Tensor or t.type is not F32:
            check_type(fn, name, t, F32)


def unary_f32(fn: str, op: Op, ctx: Context, a: Tensor) -> Tensor:
    """A new F32 node ``op(a)`` of ``a``'s shape, after checking ``ctx`` and ``a`` for ``fn``."""
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    return ctx.new_op(F32, a.ne, op, (a,))


def check_ctx(fn: str, ctx: object) -> Context:
    if not isinstance(ctx, Context):
        raise DTypeError(f"ggml_{fn}: ctx must be a ggopt.Context, got {type(ctx).__name__}")
    return ctx


def can_repeat(small: Tensor, big: Tensor) -> bool:
    """True when ``small`` tiles ``big`` exactly (ggml_can_repeat)."""
    if small.ne == big.ne or big.nelements() == 0:
        return True
    return all(s > 0 and b % s == 0 for s, b in zip(small.ne, big.ne))


def ne_str(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.ne) + "]"


def as_scalar(fn: str, name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DTypeError(f"ggml_{fn}: {name} must be a number, got {v!r}")
    try:
        return float(v)
    except OverflowError:
        raise InvalidValueError(f"ggml_{fn}: {name} must fit in a float, got an int of "
                                f"{int(v).bit_length()} bits") from None


def as_int(fn: str, name: str, v: object) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise DTypeError(f"ggml_{fn}: {name} must be an int, got {v!r}")
    return int(v.__index__())


def check_choice(fn: str, name: str, v: object, choices: dict[int, str]) -> int:
    """``v`` if it is one of the int codes in ``choices`` (code -> name), else
    InvalidValueError."""
    if isinstance(v, bool) or v not in choices:
        want = " or ".join(f"{n} ({c})" for c, n in choices.items())
        raise InvalidValueError(f"ggml_{fn}: {name} must be {want}, got {v!r}")
    return int(v)
