"""Enumerations of the optimization API, with ggml's numeric values."""

from __future__ import annotations

import enum
from typing import TypeVar

from ..errors import InvalidValueError

__all__ = ["LossType", "BuildType", "OptimizerType", "optimizer_name"]


_E = TypeVar("_E", bound="_Coercible")


class _Coercible(enum.IntEnum):
    """IntEnum that also accepts a member name, in any case, wherever a member is expected."""

    @classmethod
    def coerce(cls: type[_E], value: object, where: str) -> _E:
        """Return ``value`` as a member of ``cls`` or raise :class:`InvalidValueError`.

        Accepts a member, its integer value or its name (case-insensitive).
        """
        if isinstance(value, str):
            member = cls.__members__.get(value.upper())
            if member is not None:
                return member
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        valid = ", ".join(f"{m.name}={m.value}" for m in cls)
        raise InvalidValueError(f"unknown {cls.__name__} {value!r}; expected one of {valid} "
                                f"({where})")


class LossType(_Coercible):
    """Loss applied to the model outputs (ggml ``enum ggml_opt_loss_type``).

    ``MEAN`` and ``SUM`` reduce the outputs themselves (no labels); ``CROSS_ENTROPY`` (torch
    ``CrossEntropyLoss`` with probability targets, averaged over datapoints) and
    ``MEAN_SQUARED_ERROR`` (torch ``MSELoss``) compare them with labels.
    """

    MEAN = 0
    SUM = 1
    CROSS_ENTROPY = 2
    MEAN_SQUARED_ERROR = 3


class BuildType(_Coercible):
    """Largest graph an optimization context builds (ggml ``enum ggml_opt_build_type``).

    The values are ordered: ``FORWARD < GRAD < OPT``.
    """

    FORWARD = 10
    GRAD = 20
    OPT = 30


class OptimizerType(_Coercible):
    """Optimizer of an optimization context (ggml ``enum ggml_opt_optimizer_type``)."""

    ADAMW = 0
    SGD = 1


def optimizer_name(optimizer: OptimizerType | int) -> str:
    """Return ``"adamw"``, ``"sgd"``, or ``"undefined"`` for anything else.

    ggml: ``ggml_opt_optimizer_name``.
    """
    if isinstance(optimizer, int) and not isinstance(optimizer, bool):
        if optimizer == OptimizerType.ADAMW:
            return "adamw"
        if optimizer == OptimizerType.SGD:
            return "sgd"
    return "undefined"
