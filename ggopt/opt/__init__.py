"""ggml-opt: datasets, optimization contexts, results and training loops.

ggml: ``ggml-opt.h``. Names drop the ``ggml_opt_`` prefix; opaque handles are classes.
"""

from __future__ import annotations

from .context import OptContext
from .dataset import Dataset
from .enums import BuildType, LossType, OptimizerType, optimizer_name
from .params import (
    AdamWParams,
    OptimizerParams,
    OptParams,
    SGDParams,
    default_params,
    get_constant_optimizer_params,
    get_default_optimizer_params,
)
from .progress import epoch_callback_progress_bar
from .result import Result
from .schedule import (
    ConstantLR,
    EpochDecayLR,
    Schedule,
    WarmupCosineLR,
    constant,
    epoch_decay,
    warmup_cosine,
)
from .training import FitHistory, epoch, fit

__all__ = [
    "Dataset",
    "OptimizerParams",
    "AdamWParams",
    "SGDParams",
    "get_default_optimizer_params",
    "get_constant_optimizer_params",
    "OptParams",
    "default_params",
    "OptContext",
    "Result",
    "LossType",
    "BuildType",
    "OptimizerType",
    "optimizer_name",
    "epoch",
    "epoch_callback_progress_bar",
    "fit",
    "FitHistory",
    "Schedule",
    "ConstantLR",
    "EpochDecayLR",
    "WarmupCosineLR",
    "constant",
    "epoch_decay",
    "warmup_cosine",
]
