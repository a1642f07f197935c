"""The checkpoint file: its layout, and reading one back with every field checked.

File layout (``general.architecture = "ggopt-state"``, format version :data:`FORMAT_VERSION`):

==============================  ===========================================================
metadata key                    value
==============================  ===========================================================
``ggopt.state.version``         format version (int)
``ggopt.state.optimizer``       ``"adamw"`` or ``"sgd"``
``ggopt.state.loss_type``       loss name, e.g. ``"CROSS_ENTROPY"``
``ggopt.state.build_type``      ``"GRAD"`` or ``"OPT"``
``ggopt.state.opt_period``      accumulation period
``ggopt.state.iteration``       next optimizer step, 1-based (AdamW bias correction)
``ggopt.state.opt_i``           backward evals done in the current period
``ggopt.state.period_complete`` whether the last backward eval completed a period
``ggopt.state.epoch``           the caller's epoch (:func:`fit`: epochs completed)
``ggopt.state.params``          parameter names, in the context's order
``ggopt.schedule.*``            a schedule's kind, hyperparameters, step and epoch
==============================  ===========================================================

Tensors: each parameter under its own name; ``ggopt.adamw_m.<i>`` / ``ggopt.adamw_v.<i>``
(AdamW moments of parameter ``i``); ``ggopt.grad_acc.<i>`` and ``ggopt.grad_acc.loss`` (the
gradient accumulators, when the context has them); ``ggopt.rng`` (the generator's state words,
uint32 stored as I32); ``ggopt.dataset.permutation`` (the shard order, when a dataset is saved).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TypeVar, cast

import numpy as np

from ..errors import ShapeError
from ..io import gguf
from .rng import Mt19937

__all__ = ["FORMAT_VERSION", "ARCHITECTURE", "FileState", "read_file"]

FORMAT_VERSION = 1
ARCHITECTURE = "ggopt-state"

ARCH_KEY = "general.architecture"
STATE = "ggopt.state."
SCHEDULE = "ggopt.schedule."
RNG = "ggopt.rng"
PERMUTATION = "ggopt.dataset.permutation"
LOSS_ACC = "ggopt.grad_acc.loss"
RESERVED = "ggopt."
_T = TypeVar("_T")


def m_key(i: int) -> str:
    return f"ggopt.adamw_m.{i}"


def v_key(i: int) -> str:
    return f"ggopt.adamw_v.{i}"


def acc_key(i: int) -> str:
    return f"ggopt.grad_acc.{i}"


@dataclasses.dataclass
class FileState:
    """A checkpoint read and checked against itself (not yet against a context)."""

    path: str
    optimizer: str
    loss_type: str
    build_type: str
    opt_period: int
    iteration: int
    opt_i: int
    period_complete: bool
    epoch: int
    names: list[str]
    tensors: dict[str, np.ndarray]
    rng: Mt19937
    permutation: np.ndarray | None
    schedule: dict[str, object] | None

    @property
    def where(self) -> str:
        return f"load_state {self.path!r} (ggml_opt_load_state)"

    def has_accumulators(self) -> bool:
        return acc_key(0) in self.tensors


def _meta(metadata: dict[str, object], key: str, kind: type[_T], where: str) -> _T:
    if key not in metadata:
        raise ShapeError(f"{where}: metadata {key!r} is missing")
    value = metadata[key]
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        raise ShapeError(f"{where}: metadata {key!r}: expected {kind.__name__}, got {value!r}")
    return cast(_T, value)


def _count(metadata: dict[str, object], key: str, where: str, low: int = 0) -> int:
    value = _meta(metadata, key, int, where)
    if value < low:
        raise ShapeError(f"{where}: metadata {key!r}: expected >= {low}, got {value}")
    return value


def read_file(path: str | os.PathLike[str]) -> FileState:
    """Read the whole file and check its internal consistency."""
    spath = os.fspath(path)
    where = f"load_state {spath!r} (ggml_opt_load_state)"
    metadata, tensors = gguf.load(spath)
    arch = metadata.get(ARCH_KEY)
    if arch != ARCHITECTURE:
        raise ShapeError(f"{where}: {ARCH_KEY}: expected {ARCHITECTURE!r} (a ggopt "
                         f"checkpoint), got {arch!r}")
    version = _meta(metadata, STATE + "version", int, where)
    if version != FORMAT_VERSION:
        raise ShapeError(f"{where}: format version: expected {FORMAT_VERSION}, got {version} "
                         f"(written by another ggopt version)")
    names: list[str] = _meta(metadata, STATE + "params", list, where)
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ShapeError(f"{where}: metadata {STATE + 'params'!r}: expected unique parameter "
                         f"names, got {names!r}")
    for name in names:
        if name not in tensors:
            raise ShapeError(f"{where}: tensor of parameter {name!r} is missing")
    if RNG not in tensors or tensors[RNG].dtype != np.int32:
        raise ShapeError(f"{where}: tensor {RNG!r} (I32) is missing")
    rng = Mt19937()
    try:
        rng.set_state(tensors[RNG].reshape(-1).view(np.uint32))
    except ShapeError as exc:
        raise ShapeError(f"{where}: tensor {RNG!r}: {exc}") from None
    permutation = tensors.get(PERMUTATION)
    if permutation is not None:
        permutation = permutation.reshape(-1)
        if permutation.dtype != np.int32 or not np.array_equal(
                np.sort(permutation), np.arange(len(permutation))):
            raise ShapeError(f"{where}: tensor {PERMUTATION!r}: expected an I32 permutation "
                             f"of 0..n-1")
    schedule = {k[len(SCHEDULE):]: v for k, v in metadata.items() if k.startswith(SCHEDULE)}
    opt_period = _count(metadata, STATE + "opt_period", where, 1)
    opt_i = _count(metadata, STATE + "opt_i", where)
    if opt_i >= opt_period:
        raise ShapeError(f"{where}: opt_i: expected < opt_period={opt_period}, got {opt_i}")
    return FileState(
        path=spath,
        optimizer=_meta(metadata, STATE + "optimizer", str, where),
        loss_type=_meta(metadata, STATE + "loss_type", str, where),
        build_type=_meta(metadata, STATE + "build_type", str, where),
        opt_period=opt_period,
        iteration=_count(metadata, STATE + "iteration", where, 1),
        opt_i=opt_i,
        period_complete=_meta(metadata, STATE + "period_complete", bool, where),
        epoch=_count(metadata, STATE + "epoch", where),
        names=names,
        tensors=tensors,
        rng=rng,
        permutation=permutation,
        schedule=schedule or None,
    )
