"""Optimizer steps: in-place AdamW and SGD updates of a parameter (their hyper-parameters
are a tensor, read on the device at every step).

Kernels: :mod:`ggopt._kernels._optim`; compilers: ``backend/*_ops/optim.py``.
"""

from __future__ import annotations

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor
from ._base import check_ctx, check_f32, ne_str

__all__ = ["opt_step_adamw", "opt_step_sgd"]


def _opt_check(fn: str, a: Tensor, n_params: int, params: Tensor, **same: Tensor) -> None:
    check_f32(fn, a=a, params=params, **same)
    if not a.is_param:
        raise ShapeError(f"ggml_{fn}: '{a.name}' is not a parameter (call set_param first)")
    if not a.is_contiguous():
        raise ShapeError(f"ggml_{fn}: the parameter '{a.name}' must be contiguous")
    for name, t in same.items():
        if t.ne != a.ne:
            raise ShapeError(f"ggml_{fn}: {name} {ne_str(t)} must have the parameter's shape "
                             f"{ne_str(a)}")
    if params.nelements() != n_params:
        raise ShapeError(f"ggml_{fn}: the optimizer parameters must hold {n_params} floats, "
                         f"got {params.nelements()}")


def opt_step_adamw(ctx: Context, a: Tensor, grad: Tensor, m: Tensor, v: Tensor,
                   adamw_params: Tensor) -> Tensor:
    """One in-place AdamW step of the parameter ``a`` (ggml_opt_step_adamw).

    ``adamw_params`` holds ``[alpha, beta1, beta2, eps, wd, 1/(1-beta1^t), 1/(1-beta2^t)]``.
    """
    check_ctx("opt_step_adamw", ctx)
    _opt_check("opt_step_adamw", a, 7, adamw_params, grad=grad, m=m, v=v)
    return ctx.new_view(a, a.ne, a.nb, 0, Op.OPT_STEP_ADAMW, (a, grad, m, v, adamw_params))


def opt_step_sgd(ctx: Context, a: Tensor, grad: Tensor, sgd_params: Tensor) -> Tensor:
    """One in-place SGD step ``a = a*(1 - alpha*wd) - alpha*grad`` (ggml_opt_step_sgd)."""
    check_ctx("opt_step_sgd", ctx)
    _opt_check("opt_step_sgd", a, 2, sgd_params, grad=grad)
    return ctx.new_view(a, a.ne, a.nb, 0, Op.OPT_STEP_SGD, (a, grad, sgd_params))
