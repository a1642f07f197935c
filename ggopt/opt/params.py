"""Optimizer hyperparameters and the parameters of an optimization context."""

from __future__ import annotations

import copy
import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DTypeError, InvalidValueError
from .enums import BuildType, LossType, OptimizerType

__all__ = [
    "AdamWParams",
    "SGDParams",
    "OptimizerParams",
    "get_default_optimizer_params",
    "get_constant_optimizer_params",
    "OptParams",
    "default_params",
    "optimizer_step_values",
]


@dataclasses.dataclass
class AdamWParams:
    """AdamW hyperparameters, stored as float32 when used (ggml ``adamw`` struct).

    torch equivalents: ``alpha`` is ``lr``, ``(beta1, beta2)`` is ``betas``, ``wd`` is
    ``weight_decay`` (decoupled, as in ``torch.optim.AdamW``).
    """

    alpha: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    wd: float = 0.0


@dataclasses.dataclass
class SGDParams:
    """SGD hyperparameters (ggml ``sgd`` struct): ``alpha`` is ``lr``, ``wd`` decoupled decay."""

    alpha: float = 0.001
    wd: float = 0.0


@dataclasses.dataclass
class OptimizerParams:
    """Hyperparameters of both optimizers (ggml ``ggml_opt_optimizer_params``)."""

    adamw: AdamWParams = dataclasses.field(default_factory=AdamWParams)
    sgd: SGDParams = dataclasses.field(default_factory=SGDParams)


def get_default_optimizer_params(userdata: Any = None) -> OptimizerParams:
    """Return fresh default hyperparameters; ``userdata`` is ignored.

    AdamW ``alpha=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, wd=0``; SGD ``alpha=1e-3, wd=0``.

    ggml: ``ggml_opt_get_default_optimizer_params``.
    """
    return OptimizerParams()


def get_constant_optimizer_params(userdata: OptimizerParams) -> OptimizerParams:
    """Return a copy of ``userdata``, which must be an :class:`OptimizerParams`.

    ggml: ``ggml_opt_get_constant_optimizer_params``.
    """
    if not isinstance(userdata, OptimizerParams):
        raise DTypeError(
            "userdata must be an OptimizerParams, got "
            f"{type(userdata).__name__} (ggml_opt_get_constant_optimizer_params)"
        )
    return copy.deepcopy(userdata)


GetOptPars = Callable[[Any], OptimizerParams]


@dataclasses.dataclass
class OptParams:
    """Parameters of an optimization context (ggml ``ggml_opt_params``).

    Attributes
    ----------
    backend_sched : Scheduler
        Scheduler that allocates and computes the graphs.
    ctx_compute, inputs, outputs : Context, Tensor, Tensor or None
        All three set: static graphs, built once. All None: dynamic graphs, passed to
        :meth:`OptContext.prepare_alloc` before every alloc.
    loss_type : LossType
    build_type : BuildType
        Largest graph built: ``FORWARD`` (evaluation only), ``GRAD`` (gradients only, never
        steps) or ``OPT``.
    opt_period : int
        Physical batches per optimizer step (gradient accumulation steps).
    get_opt_pars : callable
        ``get_opt_pars(get_opt_pars_ud) -> OptimizerParams``, called once per optimizer step.
    get_opt_pars_ud : object
        Passed to ``get_opt_pars``.
    optimizer : OptimizerType
    rng_seed : int
        Seed of the context's ``std::mt19937`` used by dataset shuffles (ggml: always 5489).
    comm : ggopt.distributed.Communicator or None
        Not in ggml. Several ranks: train data-parallel, ``opt_period`` counting the physical
        batches of all ranks (``docs/distributed.md``). None or one rank: a plain context.
    """

    backend_sched: Any
    ctx_compute: Any = None
    inputs: Any = None
    outputs: Any = None
    loss_type: LossType = LossType.MEAN
    build_type: BuildType = BuildType.OPT
    opt_period: int = 1
    get_opt_pars: GetOptPars = get_default_optimizer_params
    get_opt_pars_ud: Any = None
    optimizer: OptimizerType = OptimizerType.ADAMW
    rng_seed: int = 5489
    comm: Any = None


def default_params(backend_sched: Any, loss_type: LossType | int | str) -> OptParams:
    """Return the default context parameters: dynamic graphs, OPT, ``opt_period=1``, AdamW.

    ggml: ``ggml_opt_default_params``.
    """
    loss_type = LossType.coerce(loss_type, "ggml_opt_default_params")
    return OptParams(backend_sched=backend_sched, loss_type=loss_type)


def _f32(value: Any, name: str) -> np.float32:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DTypeError(
            f"optimizer parameter {name} must be a real number, got {value!r} (ggml_opt_eval)"
        )
    try:
        out: np.float32 = np.float32(value)
    except OverflowError:
        raise InvalidValueError(f"optimizer parameter {name}={value} out of bounds, expected a "
                                "value that fits in a float (ggml_opt_eval)") from None
    return out


def _check(ok: bool | np.bool_, name: str, value: np.float32, bound: str) -> None:
    if not ok:
        raise InvalidValueError(
            f"optimizer parameter {name}={float(value)!r} out of bounds, expected {bound} "
            "(ggml_opt_eval)"
        )


def optimizer_step_values(
    pars: OptimizerParams, optimizer: OptimizerType, iteration: int
) -> np.ndarray:
    """Validate ``pars`` and return the float32 values of the optimizer-params tensor.

    AdamW: ``[alpha, beta1, beta2, eps, wd, 1/(1-beta1**t), 1/(1-beta2**t)]`` with the powers
    in float32 and ``t = iteration`` (1-based). SGD: ``[alpha, wd]``.

    Raises
    ------
    DTypeError
        ``pars`` is not an :class:`OptimizerParams` or a value is not a number.
    InvalidValueError
        A value is outside ggml's bounds: ``alpha > 0``, ``0 <= beta <= 1``, ``eps >= 0``,
        ``0 <= wd <= 1`` (NaN fails every bound).

    ggml: the optimizer-parameter checks of ``ggml_opt_eval``.
    """
    if not isinstance(pars, OptimizerParams):
        raise DTypeError(
            f"get_opt_pars must return an OptimizerParams, got {type(pars).__name__} "
            "(ggml_opt_eval)"
        )
    if optimizer == OptimizerType.ADAMW:
        p = pars.adamw
        alpha = _f32(p.alpha, "adamw.alpha")
        beta1 = _f32(p.beta1, "adamw.beta1")
        beta2 = _f32(p.beta2, "adamw.beta2")
        eps = _f32(p.eps, "adamw.eps")
        wd = _f32(p.wd, "adamw.wd")
        _check(alpha > 0, "adamw.alpha", alpha, "alpha > 0")
        _check(0 <= beta1 <= 1, "adamw.beta1", beta1, "0 <= beta1 <= 1")
        _check(0 <= beta2 <= 1, "adamw.beta2", beta2, "0 <= beta2 <= 1")
        _check(eps >= 0, "adamw.eps", eps, "eps >= 0")
        _check(0 <= wd <= 1, "adamw.wd", wd, "0 <= wd <= 1")
        t = np.float32(iteration)
        one = np.float32(1.0)
        with np.errstate(divide="ignore", over="ignore"):
            beta1h = one / (one - beta1**t)
            beta2h = one / (one - beta2**t)
        return np.array([alpha, beta1, beta2, eps, wd, beta1h, beta2h], dtype=np.float32)
    sgd = pars.sgd
    alpha, wd = _f32(sgd.alpha, "sgd.alpha"), _f32(sgd.wd, "sgd.wd")
    _check(alpha > 0, "sgd.alpha", alpha, "alpha > 0")
    _check(0 <= wd <= 1, "sgd.wd", wd, "0 <= wd <= 1")
    return np.array([alpha, wd], dtype=np.float32)
