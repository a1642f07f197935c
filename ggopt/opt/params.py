"""Optimizer hyperparameters and the parameters of an optimization context."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DTypeError
from ..graph import GRAPH_DEFAULT_SIZE
from .checks import check_float32
from .enums import BuildType, LossType, OptimizerType

if TYPE_CHECKING:
    from ..backend.sched import Scheduler
    from ..context import Context
    from ..distributed.comm import Communicator
    from ..tensor import Tensor

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


#: ggml's bounds of each hyperparameter: ``(low, high, low_open)``.
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "alpha": (0.0, math.inf, True), "beta1": (0.0, 1.0, False), "beta2": (0.0, 1.0, False),
    "eps": (0.0, math.inf, False), "wd": (0.0, 1.0, False),
}


def _check_fields(obj: AdamWParams | SGDParams, prefix: str, where: str) -> list[np.float32]:
    """Every field of ``obj`` checked in float32 within ggml's bounds; their float32 values."""
    values = tuple(getattr(obj, field) for field in _FIELDS[type(obj)])
    kinds = tuple(map(type, values))  # in the cache key: True == 1, but a bool is refused
    try:
        return list(_checked(_FIELDS[type(obj)], values, kinds, prefix, where))
    except TypeError as exc:  # an unhashable value: check it uncached (and say what it is)
        if "unhashable" not in str(exc):
            raise
        return list(_checked.__wrapped__(_FIELDS[type(obj)], values, kinds, prefix, where))


@functools.lru_cache(maxsize=256)  # every optimizer step checks its values: mostly the same
def _checked(fields: tuple[str, ...], values: tuple[object, ...], kinds: tuple[type, ...],
             prefix: str, where: str) -> tuple[np.float32, ...]:
    out = []
    for field, value in zip(fields, values):
        low, high, low_open = _BOUNDS[field]
        out.append(np.float32(check_float32(value, f"optimizer parameter {prefix}.{field}",
                                            where, low=low, high=high, low_open=low_open)))
    return tuple(out)


@dataclasses.dataclass
class AdamWParams:
    """AdamW hyperparameters, stored as float32 when used (ggml ``adamw`` struct).

    torch equivalents: ``alpha`` is ``lr``, ``(beta1, beta2)`` is ``betas``, ``wd`` is
    ``weight_decay`` (decoupled, as in ``torch.optim.AdamW``).

    The constructor checks its values as :meth:`OptimizerParams.check` does; values assigned
    later are checked at the next optimizer step (ggml's ``ggml_opt_eval``).
    """

    alpha: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    wd: float = 0.0

    def __post_init__(self) -> None:
        _check_fields(self, "adamw", "AdamWParams")


@dataclasses.dataclass
class SGDParams:
    """SGD hyperparameters (ggml ``sgd`` struct): ``alpha`` is ``lr``, ``wd`` decoupled decay.

    Checked on construction and at every optimizer step, as :class:`AdamWParams`.
    """

    alpha: float = 0.001
    wd: float = 0.0

    def __post_init__(self) -> None:
        _check_fields(self, "sgd", "SGDParams")


@dataclasses.dataclass
class OptimizerParams:
    """Hyperparameters of both optimizers (ggml ``ggml_opt_optimizer_params``)."""

    adamw: AdamWParams = dataclasses.field(default_factory=AdamWParams)
    sgd: SGDParams = dataclasses.field(default_factory=SGDParams)

    def check(self, where: str) -> None:
        """Raise unless every value is a real number whose float32 (the kernels' type) is
        finite, not flushed to zero, and within ggml's bounds: ``alpha > 0``,
        ``0 <= beta1, beta2 <= 1``, ``eps >= 0``, ``0 <= wd <= 1``.

        Raises
        ------
        DTypeError
            ``adamw``/``sgd`` of the wrong type, or a value that is not a real number.
        InvalidValueError
            A value out of those bounds; the message names it (``adamw.alpha``, ...).
        """
        for name, part, kind in (("adamw", self.adamw, AdamWParams),
                                 ("sgd", self.sgd, SGDParams)):
            if not isinstance(part, kind):
                raise DTypeError(f"OptimizerParams.{name} must be a {kind.__name__}, got "
                                 f"{type(part).__name__} ({where})")
            _check_fields(part, name, where)


def get_default_optimizer_params(userdata: object = None) -> OptimizerParams:
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


#: ``get_opt_pars(userdata) -> OptimizerParams``: ggml's ``ggml_opt_get_optimizer_params``.
GetOptPars = Callable[[object], OptimizerParams]


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
    graph_size : int
        Not in ggml. Node capacity of the static graphs ``ggml_opt_init`` builds (the forward
        graph, and its backward and optimizer copies, which keep its size; ggml: always
        ``GGML_DEFAULT_GRAPH_SIZE`` = 2048, the default here). A larger model needs more
        (SmolLM2 with LoRA: about 2200 forward nodes).
    grad_clip : float or None
        Not in ggml. The largest global L2 norm of an optimizer step's gradients (over every
        PARAM, after accumulation and the data-parallel sum): a larger one scales every
        gradient by ``grad_clip / (norm + 1e-6)``, as PyTorch's ``clip_grad_norm_``. None (the
        default): no clipping, the graphs ggml builds.
    """

    backend_sched: Scheduler
    ctx_compute: Context | None = None
    inputs: Tensor | None = None
    outputs: Tensor | None = None
    loss_type: LossType = LossType.MEAN
    build_type: BuildType = BuildType.OPT
    opt_period: int = 1
    get_opt_pars: GetOptPars = get_default_optimizer_params
    get_opt_pars_ud: object = None
    optimizer: OptimizerType = OptimizerType.ADAMW
    rng_seed: int = 5489
    comm: Communicator | None = None
    graph_size: int = GRAPH_DEFAULT_SIZE
    grad_clip: float | None = None


#: the hyperparameter names of each optimizer's parameters, in order (checked every step)
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in (AdamWParams, SGDParams)}


def default_params(backend_sched: Scheduler, loss_type: LossType | int | str) -> OptParams:
    """Return the default context parameters: dynamic graphs, OPT, ``opt_period=1``, AdamW.

    ggml: ``ggml_opt_default_params``.
    """
    loss_type = LossType.coerce(loss_type, "ggml_opt_default_params")
    return OptParams(backend_sched=backend_sched, loss_type=loss_type)


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
        ``0 <= wd <= 1``, or not a usable float32: NaN, inf or beyond 3.4e38, or nonzero but
        rounding to zero or a subnormal (see :meth:`OptimizerParams.check`).

    ggml: the optimizer-parameter checks of ``ggml_opt_eval``.
    """
    if not isinstance(pars, OptimizerParams):
        raise DTypeError(
            f"get_opt_pars must return an OptimizerParams, got {type(pars).__name__} "
            "(ggml_opt_eval)"
        )
    where = "ggml_opt_eval"
    if optimizer == OptimizerType.ADAMW:
        if not isinstance(pars.adamw, AdamWParams):
            raise DTypeError(f"OptimizerParams.adamw must be an AdamWParams, got "
                             f"{type(pars.adamw).__name__} ({where})")
        alpha, beta1, beta2, eps, wd = _check_fields(pars.adamw, "adamw", where)
        t = np.float32(iteration)
        one = np.float32(1.0)
        with np.errstate(divide="ignore", over="ignore"):
            beta1h = one / (one - beta1**t)
            beta2h = one / (one - beta2**t)
        return np.array([alpha, beta1, beta2, eps, wd, beta1h, beta2h], dtype=np.float32)
    if not isinstance(pars.sgd, SGDParams):
        raise DTypeError(f"OptimizerParams.sgd must be an SGDParams, got "
                         f"{type(pars.sgd).__name__} ({where})")
    return np.array(_check_fields(pars.sgd, "sgd", where), dtype=np.float32)
