"""Op constructors with ggml's names and argument order, each with its backward rule beside it.

Every constructor validates its inputs and raises a :class:`~ggopt.errors.GgoptError` at graph
construction time; nothing is computed here. A backward rule receives the op's output gradient
and sends contributions to the sources that need them through a :class:`GradSink`.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Protocol

from .context import Context, normalize_ne
from .errors import DTypeError, ShapeError
from .tensor import Op, Tensor, UnaryOp
from .types import F32, I32, I64, GGType, TensorFlag

__all__ = [
    "add", "add_inplace", "sub", "mul", "div", "scale", "scale_inplace", "sqr", "sqrt", "log",
    "neg", "exp", "abs", "sum", "sum_rows", "mean", "repeat", "repeat_back", "acc", "relu",
    "gelu", "silu", "tanh", "sigmoid", "step", "soft_max", "soft_max_ext", "mul_mat", "out_prod",
    "cross_entropy_loss", "cross_entropy_loss_back", "argmax", "count_equal", "get_rows",
    "get_rows_back", "im2col", "im2col_back", "conv_2d", "pool_2d", "pool_2d_back",
    "opt_step_adamw", "opt_step_sgd", "view_1d", "view_2d", "view_3d", "view_4d", "reshape",
    "reshape_1d", "reshape_2d", "reshape_3d", "reshape_4d", "permute", "transpose", "cont",
    "dup", "cpy", "set_input", "set_output", "set_param", "set_loss", "set_name", "get_name",
    "OP_POOL_MAX", "OP_POOL_AVG", "GradSink", "BACKWARD",
]

OP_POOL_MAX = 0
OP_POOL_AVG = 1


class GradSink(Protocol):
    """Where a backward rule sends gradient contributions (implemented by graph.py)."""

    def needs(self, isrc: int) -> bool:
        """True when source ``isrc`` of the node being differentiated needs a gradient."""

    def add(self, isrc: int, t: Tensor) -> None:
        """Add ``t`` to the gradient of source ``isrc``."""

    def sub(self, isrc: int, t: Tensor) -> None:
        """Subtract ``t`` from the gradient of source ``isrc``."""


BackwardRule = Callable[[Context, Tensor, Tensor, GradSink], None]
#: op (or (Op.UNARY, UnaryOp)) -> backward rule
BACKWARD: dict[object, BackwardRule] = {}


def backward(key: object) -> Callable[[BackwardRule], BackwardRule]:
    def register(fn: BackwardRule) -> BackwardRule:
        BACKWARD[key] = fn
        return fn

    return register


# --- validation helpers -------------------------------------------------------------------


def _check_tensor(fn: str, name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{fn}: {name} must be a ggopt Tensor, got {type(t).__name__}")
    return t


def _check_type(fn: str, name: str, t: Tensor, *types: GGType) -> None:
    _check_tensor(fn, name, t)
    if t.type not in types:
        want = " or ".join(x.name for x in types)
        raise DTypeError(f"ggml_{fn}: {name} must be {want}, got {t.type.name}")


def _f32(fn: str, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        _check_type(fn, name, t, F32)


def can_repeat(small: Tensor, big: Tensor) -> bool:
    """True when ``small`` tiles ``big`` exactly (ggml_can_repeat)."""
    if big.nelements() == 0:
        return True
    return all(s > 0 and b % s == 0 for s, b in zip(small.ne, big.ne))


def _ne_str(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.ne) + "]"


def _ctx(fn: str, ctx: object) -> Context:
    if not isinstance(ctx, Context):
        raise DTypeError(f"ggml_{fn}: ctx must be a ggopt.Context, got {type(ctx).__name__}")
    return ctx


def _scalar(fn: str, name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DTypeError(f"ggml_{fn}: {name} must be a number, got {v!r}")
    try:
        return float(v)
    except OverflowError:
        raise ShapeError(f"ggml_{fn}: {name} must fit in a float, got an int of "
                         f"{int(v).bit_length()} bits") from None


def _int(fn: str, name: str, v: object) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise DTypeError(f"ggml_{fn}: {name} must be an int, got {v!r}")
    return int(v)


# --- flags and names ----------------------------------------------------------------------


def set_input(t: Tensor) -> None:
    """Flag ``t`` as a graph input: allocated first, never overwritten (ggml_set_input)."""
    _check_tensor("set_input", "t", t).flags |= TensorFlag.INPUT


def set_output(t: Tensor) -> None:
    """Flag ``t`` (and the tensors it views) as an output: kept readable after compute."""
    _check_tensor("set_output", "t", t)
    while t is not None:
        t.flags |= TensorFlag.OUTPUT
        t = t.view_src


def set_param(t: Tensor) -> None:
    """Flag ``t`` as a trainable parameter (ggml_set_param); it must not be an op result."""
    _check_tensor("set_param", "t", t)
    if t.op is not Op.NONE:
        raise ShapeError(f"ggml_set_param: tensor '{t.name}' is the result of op {t.op.name}; "
                         "only tensors created directly in a context can be parameters")
    t.flags |= TensorFlag.PARAM


def set_loss(t: Tensor) -> None:
    """Flag ``t`` as the loss to minimise (ggml_set_loss); it must be a scalar F32."""
    _check_tensor("set_loss", "t", t)
    if not t.is_scalar() or t.type is not F32:
        raise ShapeError(f"ggml_set_loss: the loss must be a scalar F32 tensor, got "
                         f"{t.type.name} ne={_ne_str(t)}")
    t.flags |= TensorFlag.LOSS


def set_name(t: Tensor, name: str) -> Tensor:
    """Name ``t`` (ggml_set_name) and return it."""
    _check_tensor("set_name", "t", t)
    if not isinstance(name, str):
        raise DTypeError(f"ggml_set_name: name must be a str, got {type(name).__name__}")
    t.name = name
    return t


def get_name(t: Tensor) -> str:
    return _check_tensor("get_name", "t", t).name


# --- element-wise binary ops --------------------------------------------------------------


def _binary(fn: str, op: Op, ctx: Context, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    _ctx(fn, ctx)
    _f32(fn, a=a, b=b)
    if not can_repeat(b, a):
        raise ShapeError(f"ggml_{fn}: b {_ne_str(b)} does not tile a {_ne_str(a)} "
                         "(every a.ne[i] must be a multiple of b.ne[i])")
    if inplace:
        return ctx.new_view(a, a.ne, a.nb, 0, op, (a, b))
    return ctx.new_op(F32, a.ne, op, (a, b))


def add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` with ``b`` tiled over ``a`` (ggml_add)."""
    return _binary("add", Op.ADD, ctx, a, b, False)


def add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a += b``: the result is a view of ``a`` (ggml_add_inplace)."""
    return _binary("add_inplace", Op.ADD, ctx, a, b, True)


def sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a - b`` with ``b`` tiled over ``a`` (ggml_sub)."""
    return _binary("sub", Op.SUB, ctx, a, b, False)


def _sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary("sub_inplace", Op.SUB, ctx, a, b, True)


def mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a * b`` element-wise with ``b`` tiled over ``a`` (ggml_mul)."""
    return _binary("mul", Op.MUL, ctx, a, b, False)


def div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a / b`` element-wise with ``b`` tiled over ``a`` (ggml_div)."""
    return _binary("div", Op.DIV, ctx, a, b, False)


def _reduce_to(ctx: Context, t: Tensor, like: Tensor) -> Tensor:
    """``t`` summed over the tiles of ``like`` when ``like`` was broadcast."""
    return t if t.ne == like.ne else repeat_back(ctx, t, like)


@backward(Op.ADD)
def _add_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        sink.add(0, g)
    if sink.needs(1):
        sink.add(1, _reduce_to(ctx, g, b))


@backward(Op.SUB)
def _sub_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        sink.add(0, g)
    if sink.needs(1):
        sink.sub(1, _reduce_to(ctx, g, b))


@backward(Op.MUL)
def _mul_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        sink.add(0, mul(ctx, g, b))
    if sink.needs(1):
        sink.add(1, _reduce_to(ctx, mul(ctx, a, g), b))


@backward(Op.DIV)
def _div_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        sink.add(0, div(ctx, g, b))
    if sink.needs(1):
        sink.sub(1, _reduce_to(ctx, mul(ctx, g, div(ctx, node, b)), b))


# --- scale and element-wise unary ops -----------------------------------------------------


def _scale(fn: str, ctx: Context, a: Tensor, s: float, inplace: bool) -> Tensor:
    _ctx(fn, ctx)
    _f32(fn, a=a)
    s = _scalar(fn, "s", s)
    if inplace:
        return ctx.new_view(a, a.ne, a.nb, 0, Op.SCALE, (a,), (s, 0.0))
    return ctx.new_op(F32, a.ne, Op.SCALE, (a,), (s, 0.0))


def scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """``s * a`` (ggml_scale)."""
    return _scale("scale", ctx, a, s, False)


def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    """``a *= s``: the result is a view of ``a`` (ggml_scale_inplace)."""
    return _scale("scale_inplace", ctx, a, s, True)


@backward(Op.SCALE)
def _scale_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, scale(ctx, g, node.op_params[0]))


def _simple(fn: str, op: Op, ctx: Context, a: Tensor) -> Tensor:
    _ctx(fn, ctx)
    _f32(fn, a=a)
    return ctx.new_op(F32, a.ne, op, (a,))


def sqr(ctx: Context, a: Tensor) -> Tensor:
    """``a * a`` (ggml_sqr)."""
    return _simple("sqr", Op.SQR, ctx, a)


def sqrt(ctx: Context, a: Tensor) -> Tensor:
    """``sqrt(a)`` (ggml_sqrt)."""
    return _simple("sqrt", Op.SQRT, ctx, a)


def log(ctx: Context, a: Tensor) -> Tensor:
    """``log(a)`` (ggml_log)."""
    return _simple("log", Op.LOG, ctx, a)


@backward(Op.SQR)
def _sqr_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, scale(ctx, mul(ctx, node.src[0], g), 2.0))


@backward(Op.SQRT)
def _sqrt_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, scale(ctx, div(ctx, g, node), 0.5))


@backward(Op.LOG)
def _log_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, div(ctx, g, node.src[0]))


def _unary(fn: str, uop: UnaryOp, ctx: Context, a: Tensor) -> Tensor:
    _ctx(fn, ctx)
    _f32(fn, a=a)
    return ctx.new_op(F32, a.ne, Op.UNARY, (a,), uop)


def neg(ctx: Context, a: Tensor) -> Tensor:
    """``-a`` (ggml_neg)."""
    return _unary("neg", UnaryOp.NEG, ctx, a)


def exp(ctx: Context, a: Tensor) -> Tensor:
    """``exp(a)`` (ggml_exp)."""
    return _unary("exp", UnaryOp.EXP, ctx, a)


def abs(ctx: Context, a: Tensor) -> Tensor:  # noqa: A001 - ggml's name
    """``|a|`` (ggml_abs)."""
    return _unary("abs", UnaryOp.ABS, ctx, a)


def relu(ctx: Context, a: Tensor) -> Tensor:
    """``max(a, 0)``; the gradient at 0 is 0 (ggml_relu)."""
    return _unary("relu", UnaryOp.RELU, ctx, a)


def gelu(ctx: Context, a: Tensor) -> Tensor:
    """GELU, tanh approximation (ggml_gelu)."""
    return _unary("gelu", UnaryOp.GELU, ctx, a)


def silu(ctx: Context, a: Tensor) -> Tensor:
    """``a * sigmoid(a)`` (ggml_silu)."""
    return _unary("silu", UnaryOp.SILU, ctx, a)


def tanh(ctx: Context, a: Tensor) -> Tensor:
    """``tanh(a)`` (ggml_tanh)."""
    return _unary("tanh", UnaryOp.TANH, ctx, a)


def sigmoid(ctx: Context, a: Tensor) -> Tensor:
    """``1 / (1 + exp(-a))`` (ggml_sigmoid)."""
    return _unary("sigmoid", UnaryOp.SIGMOID, ctx, a)


def step(ctx: Context, a: Tensor) -> Tensor:
    """``1 if a > 0 else 0``; not differentiable (ggml_step)."""
    return _unary("step", UnaryOp.STEP, ctx, a)


def _unary_back(ctx: Context, uop: UnaryOp, x: Tensor, g: Tensor) -> Tensor:
    """``g * f'(x)`` for the unary function ``uop`` in one fused pass."""
    return ctx.new_op(F32, x.ne, Op.UNARY_BACK, (x, g), uop)


@backward(Op.UNARY)
def _unary_op_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    uop = node.op_params
    if not sink.needs(0):
        return
    if uop is UnaryOp.NEG:
        sink.sub(0, g)
    elif uop is UnaryOp.EXP:
        sink.add(0, mul(ctx, g, node))
    else:
        sink.add(0, _unary_back(ctx, uop, node.src[0], g))


# --- reductions and tiling ----------------------------------------------------------------


def sum(ctx: Context, a: Tensor) -> Tensor:  # noqa: A001 - ggml's name
    """The scalar sum of all elements, accumulated in double (ggml_sum)."""
    _ctx("sum", ctx)
    _f32("sum", a=a)
    return ctx.new_op(F32, (1, 1, 1, 1), Op.SUM, (a,))


def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """Row sums: ``[ne0, ne1, ne2, ne3] -> [1, ne1, ne2, ne3]`` (ggml_sum_rows)."""
    _ctx("sum_rows", ctx)
    _f32("sum_rows", a=a)
    return ctx.new_op(F32, (1,) + a.ne[1:], Op.SUM_ROWS, (a,))


def mean(ctx: Context, a: Tensor) -> Tensor:
    """Row means: ``[ne0, ne1, ne2, ne3] -> [1, ne1, ne2, ne3]`` (ggml_mean)."""
    _ctx("mean", ctx)
    _f32("mean", a=a)
    return ctx.new_op(F32, (1,) + a.ne[1:], Op.MEAN, (a,))


@backward(Op.SUM)
@backward(Op.SUM_ROWS)
def _sum_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, repeat(ctx, g, node.src[0]))


@backward(Op.MEAN)
def _mean_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        a = node.src[0]
        sink.add(0, repeat(ctx, scale(ctx, g, 1.0 / a.ne[0]), a))


def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a`` tiled to the shape of ``b`` (ggml_repeat)."""
    _ctx("repeat", ctx)
    _f32("repeat", a=a)
    _check_tensor("repeat", "b", b)
    if not can_repeat(a, b):
        raise ShapeError(f"ggml_repeat: a {_ne_str(a)} does not tile b {_ne_str(b)}")
    return ctx.new_op(F32, b.ne, Op.REPEAT, (a,))


def repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a`` summed over its tiles into the shape of ``b`` (ggml_repeat_back)."""
    _ctx("repeat_back", ctx)
    _f32("repeat_back", a=a)
    _check_tensor("repeat_back", "b", b)
    if not can_repeat(b, b) or not can_repeat(b, a):
        raise ShapeError(f"ggml_repeat_back: b {_ne_str(b)} does not tile a {_ne_str(a)}")
    return ctx.new_op(F32, b.ne, Op.REPEAT_BACK, (a,))


@backward(Op.REPEAT)
def _repeat_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, repeat_back(ctx, g, node.src[0]))


@backward(Op.REPEAT_BACK)
def _repeat_back_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, repeat(ctx, g, node.src[0]))


def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """A copy of ``a`` with ``b`` added into the view ``(b.ne, nb1, nb2, nb3, offset)``.

    ggml: ``ggml_acc``.
    """
    _ctx("acc", ctx)
    _f32("acc", a=a, b=b)
    if not a.is_contiguous():
        raise ShapeError("ggml_acc: a must be contiguous")
    nb = (4, _int("acc", "nb1", nb1), _int("acc", "nb2", nb2), _int("acc", "nb3", nb3))
    _check_strides("acc", nb)
    offset = _int("acc", "offset", offset)
    end = offset + 4 + builtins.sum((n - 1) * s for n, s in zip(b.ne, nb))
    if offset < 0 or (b.nelements() > 0 and end > a.nbytes()):
        raise ShapeError(f"ggml_acc: the view of b {_ne_str(b)} at offset {offset} reaches byte "
                         f"{end}, beyond a's {a.nbytes()} bytes")
    return ctx.new_op(F32, a.ne, Op.ACC, (a, b), (nb, offset))


@backward(Op.ACC)
def _acc_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    nb, offset = node.op_params
    if sink.needs(0):
        sink.add(0, g)
    if sink.needs(1):
        part = view_4d(ctx, g, *b.ne, nb[1], nb[2], nb[3], offset)
        sink.add(1, reshape(ctx, cont(ctx, part), b))


# --- softmax and losses -------------------------------------------------------------------


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """Softmax along ``ne0`` (ggml_soft_max)."""
    return soft_max_ext(ctx, a, 1.0)


def soft_max_ext(ctx: Context, a: Tensor, scale: float) -> Tensor:
    """Softmax of ``scale * a`` along ``ne0`` (ggml_soft_max_ext without mask)."""
    _ctx("soft_max", ctx)
    _f32("soft_max", a=a)
    return ctx.new_op(F32, a.ne, Op.SOFT_MAX, (a,), _scalar("soft_max", "scale", scale))


@backward(Op.SOFT_MAX)
def _soft_max_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        back = ctx.new_op(F32, node.ne, Op.SOFT_MAX_BACK, (g, node))
        s = node.op_params
        sink.add(0, back if s == 1.0 else scale(ctx, back, s))


def cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Mean over rows of ``-sum(b * log_softmax(a))``: a scalar (ggml_cross_entropy_loss).

    ``a`` holds logits and ``b`` target probabilities, both ``[nclasses, nrows, ...]``.
    """
    _ctx("cross_entropy_loss", ctx)
    _f32("cross_entropy_loss", a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_cross_entropy_loss: logits {_ne_str(a)} and labels "
                         f"{_ne_str(b)} must have the same shape")
    if a.nelements() == 0:
        raise ShapeError(f"ggml_cross_entropy_loss: logits {_ne_str(a)} need at least one class "
                         "and one row (the loss is a mean over rows)")
    return ctx.new_op(F32, (1, 1, 1, 1), Op.CROSS_ENTROPY_LOSS, (a, b))


def cross_entropy_loss_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Gradient of :func:`cross_entropy_loss` w.r.t. the logits ``b`` given the scalar
    output gradient ``a`` and labels ``c`` (ggml_cross_entropy_loss_back)."""
    _ctx("cross_entropy_loss_back", ctx)
    _f32("cross_entropy_loss_back", a=a, b=b, c=c)
    if not a.is_scalar():
        raise ShapeError(f"ggml_cross_entropy_loss_back: the gradient must be a scalar, got "
                         f"{_ne_str(a)}")
    if b.ne != c.ne:
        raise ShapeError(f"ggml_cross_entropy_loss_back: logits {_ne_str(b)} and labels "
                         f"{_ne_str(c)} must have the same shape")
    return ctx.new_op(F32, b.ne, Op.CROSS_ENTROPY_LOSS_BACK, (a, b, c))


@backward(Op.CROSS_ENTROPY_LOSS)
def _ce_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(1):
        raise ShapeError("ggml_cross_entropy_loss: gradients w.r.t. the labels are not supported; "
                         "the labels must not depend on a parameter")
    if sink.needs(0):
        sink.add(0, cross_entropy_loss_back(ctx, g, a, b))


# --- matrix products ----------------------------------------------------------------------


def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a=[K, M, A2, A3]`` times ``b=[K, N, B2, B3]`` gives ``[M, N, B2, B3]`` (ggml_mul_mat).

    In NumPy terms ``C = B @ A.T``; ``a`` is broadcast over dims 2 and 3.
    """
    _ctx("mul_mat", ctx)
    _f32("mul_mat", a=a, b=b)
    if a.ne[0] != b.ne[0]:
        raise ShapeError(f"ggml_mul_mat: a.ne[0]={a.ne[0]} must equal b.ne[0]={b.ne[0]} "
                         f"(a {_ne_str(a)}, b {_ne_str(b)})")
    if a.ne[2] == 0 or a.ne[3] == 0 or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise ShapeError(f"ggml_mul_mat: a {_ne_str(a)} cannot be broadcast over b {_ne_str(b)} "
                         "in dims 2 and 3")
    if a.is_transposed():
        raise ShapeError("ggml_mul_mat: a must not be transposed (use cont first)")
    return ctx.new_op(F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), Op.MUL_MAT, (a, b))


def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a=[n0, K]`` and ``b=[n1, K]`` give ``[n0, n1]``: ``B.T @ A`` in NumPy terms.

    ggml: ``ggml_out_prod``.
    """
    _ctx("out_prod", ctx)
    _f32("out_prod", a=a, b=b)
    if a.ne[1] != b.ne[1]:
        raise ShapeError(f"ggml_out_prod: a.ne[1]={a.ne[1]} must equal b.ne[1]={b.ne[1]}")
    if a.ne[2] == 0 or a.ne[3] == 0 or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise ShapeError(f"ggml_out_prod: a {_ne_str(a)} cannot be broadcast over b {_ne_str(b)} "
                         "in dims 2 and 3")
    return ctx.new_op(F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]), Op.OUT_PROD, (a, b))


def _sum_blocks(ctx: Context, t: Tensor, a: Tensor) -> Tensor:
    """``t=[K, M, B2, B3]`` summed over the blocks that mul_mat's broadcast of ``a=[K, M, A2, A3]``
    maps to one slice of ``a`` (slice ``i`` of ``a`` serves slices ``i*r .. i*r + r-1``)."""
    K, M, B2, B3 = t.ne
    A2, A3 = a.ne[2], a.ne[3]
    r2, r3 = B2 // A2, B3 // A3
    if r2 > 1:  # rows of K*M floats: [K*M, r2, A2, B3] with the block index j in dim 1
        v = view_4d(ctx, t, K * M, r2, A2, B3, t.nb[2], t.nb[2] * r2, t.nb[3], 0)
        t = reshape_4d(ctx, repeat_back(ctx, v, ctx.new_tensor(F32, (K * M, 1, A2, B3))),
                       K, M, A2, B3)
    if r3 > 1:
        v = view_4d(ctx, t, K * M * A2, r3, 1, A3, t.nb[3], t.nb[3], t.nb[3] * r3, 0)
        t = reshape_4d(ctx, repeat_back(ctx, v, ctx.new_tensor(F32, (K * M * A2, 1, 1, A3))),
                       K, M, A2, A3)
    return t


@backward(Op.MUL_MAT)
def _mul_mat_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        sink.add(0, _sum_blocks(ctx, out_prod(ctx, b, g), a))
    if sink.needs(1):
        sink.add(1, out_prod(ctx, a, transpose(ctx, g)))


@backward(Op.OUT_PROD)
def _out_prod_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    # NumPy terms: R = B^T A, so dA = B G and dB = A G^T.
    a, b = node.src
    if a.ne[2:] != b.ne[2:]:
        raise ShapeError("ggml_out_prod: backward of a broadcast out_prod is not supported")
    if sink.needs(0):
        sink.add(0, mul_mat(ctx, cont(ctx, transpose(ctx, g)), b))
    if sink.needs(1):
        sink.add(1, mul_mat(ctx, g, a))


# --- integer ops --------------------------------------------------------------------------


def argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the maximum of each row, the last one on ties: I32 ``[ne1]`` (ggml_argmax)."""
    _ctx("argmax", ctx)
    _f32("argmax", a=a)
    if not a.is_matrix():
        raise ShapeError(f"ggml_argmax: a must be a matrix (ne2 == ne3 == 1), got {_ne_str(a)}")
    if a.ne[0] == 0 and a.ne[1] > 0:
        raise ShapeError(f"ggml_argmax: rows of a {_ne_str(a)} are empty; no maximum")
    return ctx.new_op(I32, (a.ne[1], 1, 1, 1), Op.ARGMAX, (a,))


def count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Number of equal elements of two I32 tensors: an I64 scalar (ggml_count_equal)."""
    _ctx("count_equal", ctx)
    _check_type("count_equal", "a", a, I32)
    _check_type("count_equal", "b", b, I32)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_count_equal: a {_ne_str(a)} and b {_ne_str(b)} differ in shape")
    return ctx.new_op(I64, (1, 1, 1, 1), Op.COUNT_EQUAL, (a, b))


def get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of ``a`` picked by the I32 indices ``b`` (ggml_get_rows; embeddings).

    ``a=[ne0, nrows, ne2, ne3]``, ``b=[n, ne2, ne3]`` gives ``[ne0, n, ne2, ne3]``.
    """
    _ctx("get_rows", ctx)
    _f32("get_rows", a=a)
    _check_type("get_rows", "b", b, I32)
    if b.ne[3] != 1 or b.ne[1] != a.ne[2] or b.ne[2] != a.ne[3]:
        raise ShapeError(f"ggml_get_rows: indices {_ne_str(b)} must be [n, a.ne2, a.ne3] for "
                         f"a {_ne_str(a)}")
    return ctx.new_op(F32, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), Op.GET_ROWS, (a, b))


def get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Scatter-add of the rows ``a=[ne0, n]`` to indices ``b=[n]``, in the shape of ``c``.

    ggml: ``ggml_get_rows_back``.
    """
    _ctx("get_rows_back", ctx)
    _f32("get_rows_back", a=a)
    _check_type("get_rows_back", "b", b, I32)
    _check_tensor("get_rows_back", "c", c)
    if not a.is_matrix() or not b.is_vector() or not c.is_matrix() or \
            b.ne[0] != a.ne[1] or a.ne[0] != c.ne[0]:
        raise ShapeError(f"ggml_get_rows_back: expected a=[ne0, n], b=[n], c=[ne0, nrows], got "
                         f"a {_ne_str(a)}, b {_ne_str(b)}, c {_ne_str(c)}")
    return ctx.new_op(F32, c.ne, Op.GET_ROWS_BACK, (a, b))


@backward(Op.GET_ROWS)
def _get_rows_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        if not a.is_matrix():
            raise ShapeError("ggml_get_rows: gradients are supported for 2-D sources only")
        sink.add(0, get_rows_back(ctx, g, b, a))


# --- convolution and pooling --------------------------------------------------------------


def _conv_out(fn: str, size: int, k: int, s: int, p: int, d: int) -> int:
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    if out <= 0:
        raise ShapeError(f"ggml_{fn}: input size {size} with kernel {k}, stride {s}, padding {p}, "
                         f"dilation {d} gives an empty output")
    return out


#: Kernel sizes, strides, paddings and dilations reach the kernels as C ints.
_INT32_LIMIT = 2**31


def _conv_params(fn: str, **params: int | float) -> tuple[int, ...]:
    """Window sizes (k*), strides (s*) and dilations (d*) >= 1, paddings (p*) >= 0, all
    below 2**31."""
    vals = []
    for name, v in params.items():
        if isinstance(v, float) and v.is_integer():  # ggml passes pool padding as float
            v = int(v)
        v = _int(fn, name, v)
        if (name[0] in "ksd" and v < 1) or (name[0] == "p" and v < 0):
            raise ShapeError(f"ggml_{fn}: {name} must be "
                             f"{'>= 1' if name[0] in 'ksd' else '>= 0'}, got {v}")
        if v >= _INT32_LIMIT:
            raise ShapeError(f"ggml_{fn}: {name} must be < 2**31, got {v}")
        vals.append(v)
    return tuple(vals)


def im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
           d1: int, is_2D: bool = True, dst_type: GGType = F32) -> Tensor:
    """Unfold image patches (ggml_im2col).

    ``a`` is the kernel ``[KW, KH, IC, OC]`` (used for its shape only), ``b`` the input
    ``[IW, IH, IC, N]``; the result is ``[IC*KH*KW, OW, OH, N]``. ggopt computes in float32.
    """
    _ctx("im2col", ctx)
    _check_tensor("im2col", "a", a)
    _f32("im2col", b=b)
    if not is_2D:
        raise ShapeError("ggml_im2col: only 2-D im2col (is_2D=True) is supported by ggopt")
    if dst_type != F32:
        raise DTypeError("ggml_im2col: ggopt computes convolutions in float32; dst_type must "
                         "be F32")
    if a.ne[2] != b.ne[2]:
        raise ShapeError(f"ggml_im2col: kernel channels a.ne[2]={a.ne[2]} must equal input "
                         f"channels b.ne[2]={b.ne[2]}")
    prm = _conv_params("im2col", s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    KW, KH = _conv_params("im2col", kw=a.ne[0], kh=a.ne[1])
    OW = _conv_out("im2col", b.ne[0], KW, prm[0], prm[2], prm[4])
    OH = _conv_out("im2col", b.ne[1], KH, prm[1], prm[3], prm[5])
    return ctx.new_op(F32, (b.ne[2] * KH * KW, OW, OH, b.ne[3]), Op.IM2COL, (a, b), prm)


def im2col_back(ctx: Context, a: Tensor, b: Tensor, ne: tuple[int, ...], s0: int, s1: int,
                p0: int, p1: int, d0: int, d1: int, is_2D: bool = True) -> Tensor:
    """Adjoint of :func:`im2col`: fold ``a`` back into an input of shape ``ne``.

    ggml: ``ggml_im2col_back``.
    """
    _ctx("im2col_back", ctx)
    _f32("im2col_back", a=a)
    _check_tensor("im2col_back", "b", b)
    if not is_2D:
        raise ShapeError("ggml_im2col_back: only 2-D im2col is supported by ggopt")
    ne = normalize_ne(ne)
    prm = _conv_params("im2col_back", s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    KW, KH = _conv_params("im2col_back", kw=b.ne[0], kh=b.ne[1])
    OW = _conv_out("im2col_back", ne[0], KW, prm[0], prm[2], prm[4])
    OH = _conv_out("im2col_back", ne[1], KH, prm[1], prm[3], prm[5])
    want = (ne[2] * KH * KW, OW, OH, ne[3])
    if a.ne != want:
        raise ShapeError(f"ggml_im2col_back: gradient {_ne_str(a)} must be {list(want)}")
    return ctx.new_op(F32, ne, Op.IM2COL_BACK, (a, b), prm)


@backward(Op.IM2COL)
def _im2col_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(1):
        k, x = node.src
        sink.add(1, im2col_back(ctx, g, k, x.ne, *node.op_params))


def conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
            d1: int) -> Tensor:
    """2-D cross-correlation as ggml composes it: im2col, then mul_mat (ggml_conv_2d).

    ``a`` is the kernel ``[KW, KH, IC, OC]``, ``b`` the input ``[IW, IH, IC, N]``; the result is
    ``[OW, OH, OC, N]`` (NCHW in NumPy terms, PyTorch's ``conv2d``).
    """
    _f32("conv_2d", a=a, b=b)
    cols = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, F32)
    K, OW, OH, N = cols.ne
    res = mul_mat(ctx, reshape_2d(ctx, cols, K, OW * OH * N), reshape_2d(ctx, a, K, a.ne[3]))
    res = reshape_4d(ctx, res, OW, OH, N, a.ne[3])
    return cont(ctx, permute(ctx, res, 0, 1, 3, 2))


def pool_2d(ctx: Context, a: Tensor, op: int, k0: int, k1: int, s0: int, s1: int, p0: float,
            p1: float) -> Tensor:
    """2-D max or average pooling of ``a=[IW, IH, C, N]`` (ggml_pool_2d).

    ``op`` is :data:`OP_POOL_MAX` or :data:`OP_POOL_AVG`; output size ``(I + 2p - k)/s + 1``.
    """
    _ctx("pool_2d", ctx)
    _f32("pool_2d", a=a)
    if op not in (OP_POOL_MAX, OP_POOL_AVG):
        raise ShapeError(f"ggml_pool_2d: op must be OP_POOL_MAX (0) or OP_POOL_AVG (1), got {op!r}")
    prm = _conv_params("pool_2d", k0=k0, k1=k1, s0=s0, s1=s1, p0=p0, p1=p1)
    OW = math.trunc((a.ne[0] + 2 * prm[4] - prm[0]) / prm[2]) + 1
    OH = math.trunc((a.ne[1] + 2 * prm[5] - prm[1]) / prm[3]) + 1
    if OW <= 0 or OH <= 0:
        raise ShapeError(f"ggml_pool_2d: input {_ne_str(a)} is smaller than the window {k0}x{k1}")
    return ctx.new_op(F32, (OW, OH, a.ne[2], a.ne[3]), Op.POOL_2D, (a,), (op,) + prm)


def pool_2d_back(ctx: Context, a: Tensor, af: Tensor, op: int, k0: int, k1: int, s0: int,
                 s1: int, p0: float, p1: float) -> Tensor:
    """Gradient of :func:`pool_2d` w.r.t. its input ``af`` given the output gradient ``a``."""
    _ctx("pool_2d_back", ctx)
    _f32("pool_2d_back", a=a, af=af)
    prm = _conv_params("pool_2d_back", k0=k0, k1=k1, s0=s0, s1=s1, p0=p0, p1=p1)
    OW = math.trunc((af.ne[0] + 2 * prm[4] - prm[0]) / prm[2]) + 1
    OH = math.trunc((af.ne[1] + 2 * prm[5] - prm[1]) / prm[3]) + 1
    if a.ne != (OW, OH, af.ne[2], af.ne[3]):
        raise ShapeError(f"ggml_pool_2d_back: gradient {_ne_str(a)} does not match the pooled "
                         f"shape {[OW, OH, af.ne[2], af.ne[3]]}")
    if op not in (OP_POOL_MAX, OP_POOL_AVG):
        raise ShapeError(f"ggml_pool_2d_back: op must be OP_POOL_MAX or OP_POOL_AVG, got {op!r}")
    return ctx.new_op(F32, af.ne, Op.POOL_2D_BACK, (a, af), (op,) + prm)


@backward(Op.POOL_2D)
def _pool_2d_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, pool_2d_back(ctx, g, node.src[0], *node.op_params))


# --- optimizer steps ----------------------------------------------------------------------


def _opt_check(fn: str, a: Tensor, n_params: int, params: Tensor, **same: Tensor) -> None:
    _f32(fn, a=a, params=params, **same)
    if not a.is_param:
        raise ShapeError(f"ggml_{fn}: '{a.name}' is not a parameter (call set_param first)")
    if not a.is_contiguous():
        raise ShapeError(f"ggml_{fn}: the parameter '{a.name}' must be contiguous")
    for name, t in same.items():
        if t.ne != a.ne:
            raise ShapeError(f"ggml_{fn}: {name} {_ne_str(t)} must have the parameter's shape "
                             f"{_ne_str(a)}")
    if params.nelements() != n_params:
        raise ShapeError(f"ggml_{fn}: the optimizer parameters must hold {n_params} floats, "
                         f"got {params.nelements()}")


def opt_step_adamw(ctx: Context, a: Tensor, grad: Tensor, m: Tensor, v: Tensor,
                   adamw_params: Tensor) -> Tensor:
    """One in-place AdamW step of the parameter ``a`` (ggml_opt_step_adamw).

    ``adamw_params`` holds ``[alpha, beta1, beta2, eps, wd, 1/(1-beta1^t), 1/(1-beta2^t)]``.
    """
    _ctx("opt_step_adamw", ctx)
    _opt_check("opt_step_adamw", a, 7, adamw_params, grad=grad, m=m, v=v)
    return ctx.new_view(a, a.ne, a.nb, 0, Op.OPT_STEP_ADAMW, (a, grad, m, v, adamw_params))


def opt_step_sgd(ctx: Context, a: Tensor, grad: Tensor, sgd_params: Tensor) -> Tensor:
    """One in-place SGD step ``a = a*(1 - alpha*wd) - alpha*grad`` (ggml_opt_step_sgd)."""
    _ctx("opt_step_sgd", ctx)
    _opt_check("opt_step_sgd", a, 2, sgd_params, grad=grad)
    return ctx.new_view(a, a.ne, a.nb, 0, Op.OPT_STEP_SGD, (a, grad, sgd_params))


# --- views, reshapes and copies -----------------------------------------------------------


def _check_strides(fn: str, nb: tuple[int, ...]) -> None:
    """Byte strides must be >= 0: with a negative one, a view that passes the end-of-data
    check would still reach memory before its start (another tensor's)."""
    for i, n in enumerate(nb):
        if n < 0:
            raise ShapeError(f"ggml_{fn}: byte stride nb{i} must be >= 0, got {n}")


def _view(fn: str, ctx: Context, a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...] | None,
          offset: int) -> Tensor:
    _ctx(fn, ctx)
    _check_tensor(fn, "a", a)
    ne4 = normalize_ne(ne)
    offset = _int(fn, "offset", offset)
    if nb is None:
        nb4 = None
        nbl = (a.type.size, a.type.size * ne4[0])
        nbl = nbl + (nbl[1] * ne4[1], nbl[1] * ne4[1] * ne4[2])
    else:
        nbl = (a.type.size,) + tuple(_int(fn, f"nb{i + 1}", n) for i, n in enumerate(nb))
        _check_strides(fn, nbl)
        nbl = nbl + tuple(nbl[-1] * ne4[i] for i in range(len(nbl), 4))
        nb4 = tuple(nbl)
    size = 0 if 0 in ne4 else a.type.size + builtins.sum((n - 1) * s for n, s in zip(ne4, nbl))
    owner_bytes = a.data_owner().nbytes()
    start = (a.view_offs if a.view_src is not None else 0) + offset
    if offset < 0 or start + size > owner_bytes:
        raise ShapeError(f"ggml_{fn}: a view of {size} bytes at offset {offset} does not fit in "
                         f"the {owner_bytes} bytes of '{a.data_owner().name}'")
    return ctx.new_view(a, ne4, nb4, offset, Op.VIEW, (a,), offset)


def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    """A 1-D view of ``a`` starting at byte ``offset`` (ggml_view_1d)."""
    return _view("view_1d", ctx, a, (ne0,), None, offset)


def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """A 2-D view with row stride ``nb1`` bytes (ggml_view_2d)."""
    return _view("view_2d", ctx, a, (ne0, ne1), (nb1,), offset)


def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
            offset: int) -> Tensor:
    """A 3-D view (ggml_view_3d)."""
    return _view("view_3d", ctx, a, (ne0, ne1, ne2), (nb1, nb2), offset)


def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int,
            nb3: int, offset: int) -> Tensor:
    """A 4-D view (ggml_view_4d)."""
    return _view("view_4d", ctx, a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


@backward(Op.VIEW)
def _view_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        a = node.src[0]
        if not a.is_contiguous():
            raise ShapeError("ggml_view: gradients of views of non-contiguous tensors are not "
                             "supported")
        base = scale(ctx, a, 0.0)
        sink.add(0, acc(ctx, base, g, node.nb[1], node.nb[2], node.nb[3], node.op_params))


def _reshape(fn: str, ctx: Context, a: Tensor, ne: tuple[int, ...]) -> Tensor:
    _ctx(fn, ctx)
    _check_tensor(fn, "a", a)
    ne4 = normalize_ne(ne)
    if not a.is_contiguous():
        raise ShapeError(f"ggml_{fn}: a must be contiguous (use cont first)")
    n = ne4[0] * ne4[1] * ne4[2] * ne4[3]
    if n != a.nelements():
        raise ShapeError(f"ggml_{fn}: cannot reshape {a.nelements()} elements {_ne_str(a)} "
                         f"into {list(ne4)} ({n} elements)")
    return ctx.new_view(a, ne4, None, 0, Op.RESHAPE, (a,))


def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a`` with the shape of ``b`` (ggml_reshape)."""
    _check_tensor("reshape", "b", b)
    return _reshape("reshape", ctx, a, b.ne)


def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return _reshape("reshape_1d", ctx, a, (ne0,))


def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return _reshape("reshape_2d", ctx, a, (ne0, ne1))


def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _reshape("reshape_3d", ctx, a, (ne0, ne1, ne2))


def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _reshape("reshape_4d", ctx, a, (ne0, ne1, ne2, ne3))


@backward(Op.RESHAPE)
def _reshape_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, reshape(ctx, g if g.is_contiguous() else cont(ctx, g), node.src[0]))


def permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Move source dimension ``i`` to position ``axis_i`` (ggml_permute)."""
    _ctx("permute", ctx)
    _check_tensor("permute", "a", a)
    axes = tuple(_int("permute", f"axis{i}", x) for i, x in enumerate((axis0, axis1, axis2, axis3)))
    if sorted(axes) != [0, 1, 2, 3]:
        raise ShapeError(f"ggml_permute: axes must be a permutation of 0..3, got {list(axes)}")
    ne = [0] * 4
    nb = [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    return ctx.new_view(a, tuple(ne), tuple(nb), 0, Op.PERMUTE, (a,), axes)


def transpose(ctx: Context, a: Tensor) -> Tensor:
    """Swap dims 0 and 1 without copying (ggml_transpose)."""
    _ctx("transpose", ctx)
    _check_tensor("transpose", "a", a)
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return ctx.new_view(a, ne, nb, 0, Op.TRANSPOSE, (a,))


@backward(Op.PERMUTE)
def _permute_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        axes = node.op_params
        inv = [0] * 4
        for i, ax in enumerate(axes):
            inv[ax] = i
        sink.add(0, permute(ctx, g, *inv))


@backward(Op.TRANSPOSE)
def _transpose_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, transpose(ctx, g))


def cont(ctx: Context, a: Tensor) -> Tensor:
    """A contiguous copy of ``a`` (ggml_cont)."""
    _ctx("cont", ctx)
    _check_tensor("cont", "a", a)
    return ctx.new_op(a.type, a.ne, Op.CONT, (a,))


def dup(ctx: Context, a: Tensor) -> Tensor:
    """A copy of ``a`` (ggml_dup)."""
    _ctx("dup", ctx)
    _check_tensor("dup", "a", a)
    return ctx.new_op(a.type, a.ne, Op.DUP, (a,))


def cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy ``a`` into ``b`` converting the type; the result is a view of ``b`` (ggml_cpy)."""
    _ctx("cpy", ctx)
    _check_tensor("cpy", "a", a)
    _check_tensor("cpy", "b", b)
    if a.nelements() != b.nelements():
        raise ShapeError(f"ggml_cpy: a has {a.nelements()} elements, b has {b.nelements()}")
    return ctx.new_view(b, b.ne, b.nb, 0, Op.CPY, (a, b))


@backward(Op.CONT)
@backward(Op.DUP)
@backward(Op.CPY)
def _copy_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        a = node.src[0]
        sink.add(0, g if g.ne == a.ne else reshape(ctx, cont(ctx, g), a))


#: Sources whose gradient is never propagated, per op (spec §5.2).
IGNORED_SOURCES: dict[Op, frozenset[int]] = {
    Op.IM2COL: frozenset({0}),
    Op.IM2COL_BACK: frozenset({0}),
    Op.CPY: frozenset({1}),
    Op.GET_ROWS: frozenset({1}),
    Op.GET_ROWS_BACK: frozenset({1}),
}


def ignored_sources(node: Tensor) -> frozenset[int]:
    """Source indices of ``node`` that never receive gradients."""
    if node.op is Op.UNARY and node.op_params is UnaryOp.STEP:
        return frozenset({0})
    return IGNORED_SOURCES.get(node.op, frozenset())
