"""The checkpoint file: its layout, writing one with checksums, reading one back checked.

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
``ggopt.run.*``                 what the run depends on (:func:`fit`: batch, micro-batch,
                                validation split, a digest of the data), checked on resume
``ggopt.checksum.<tensor>``     xxh3-128 of the tensor's type, shape and bytes (hex)
``ggopt.checksum``              xxh3-128 of every other metadata entry (hex)
==============================  ===========================================================

Tensors: each parameter under its own name; ``ggopt.adamw_m.<i>`` / ``ggopt.adamw_v.<i>``
(AdamW moments of parameter ``i``); ``ggopt.grad_acc.<i>`` and ``ggopt.grad_acc.loss`` (the
gradient accumulators, when the context has them); ``ggopt.rng`` (the generator's state words,
uint32 stored as I32); ``ggopt.dataset.permutation`` (the shard order, when a dataset is saved).

Checksums are per tensor, so a damaged file names the damaged field; xxh3 hashes at ~20 GB/s,
about 1 % of a save's time. They detect accidental damage (flipped bits, truncation, a tensor
or key removed), not deliberate forgery.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from typing import TypeVar, cast

import numpy as np
import xxhash

from ..errors import InvalidValueError, ShapeError
from ..io import gguf
from .rng import Mt19937
from .state import Counters, Snapshot

__all__ = ["FORMAT_VERSION", "ARCHITECTURE", "FileState", "read_file", "write_file"]

FORMAT_VERSION = 2
ARCHITECTURE = "ggopt-state"

ARCH_KEY = "general.architecture"
STATE = "ggopt.state."
SCHEDULE = "ggopt.schedule."
RNG = "ggopt.rng"
PERMUTATION = "ggopt.dataset.permutation"
LOSS_ACC = "ggopt.grad_acc.loss"
RUN = "ggopt.run."
CHECKSUM = "ggopt.checksum"
RESERVED = "ggopt."
_T = TypeVar("_T")


def m_key(i: int) -> str:
    return f"ggopt.adamw_m.{i}"


def v_key(i: int) -> str:
    return f"ggopt.adamw_v.{i}"


def acc_key(i: int) -> str:
    return f"ggopt.grad_acc.{i}"


def tensor_checksum(arr: np.ndarray) -> str:
    """xxh3-128 (hex) of an array's type, shape and bytes."""
    h = xxhash.xxh3_128(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).data)
    return h.hexdigest()


def _canon(value: object) -> object:
    """A metadata value as it reads back from GGUF (floats as doubles), for hashing."""
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return ["b", bool(value)]
    if isinstance(value, (int, np.integer)):
        return ["i", int(value)]
    if isinstance(value, (float, np.floating)):
        return ["f", repr(float(value))]
    return ["s", str(value)]


def metadata_checksum(metadata: Mapping[str, object]) -> str:
    """xxh3-128 (hex) of every metadata entry but the checksums."""
    items = sorted((k, _canon(v)) for k, v in metadata.items() if not k.startswith(CHECKSUM))
    return xxhash.xxh3_128(json.dumps(items).encode()).hexdigest()


def write_file(path: str | os.PathLike[str], metadata: dict[str, object],
               tensors: dict[str, np.ndarray]) -> None:
    """Write ``metadata`` and ``tensors`` with their checksums (atomically)."""
    out = dict(metadata)
    for name, arr in tensors.items():
        out[f"{CHECKSUM}.{name}"] = tensor_checksum(arr)
    out[CHECKSUM] = metadata_checksum(metadata)
    gguf.save(path, tensors, out)  # atomic: temporary file, fsync, rename


def _verify(metadata: dict[str, object], tensors: dict[str, np.ndarray], where: str) -> None:
    """Raise InvalidValueError unless every checksum matches (and covers every tensor)."""
    damaged = "the file is damaged"
    if metadata.get(CHECKSUM) != metadata_checksum(metadata):
        raise InvalidValueError(f"{where}: metadata: checksum mismatch ({damaged})")
    for name, arr in tensors.items():
        if metadata.get(f"{CHECKSUM}.{name}") != tensor_checksum(arr):
            raise InvalidValueError(f"{where}: tensor {name!r}: checksum mismatch ({damaged})")
    prefix = CHECKSUM + "."
    for key in metadata:
        if key.startswith(prefix) and key[len(prefix):] not in tensors:
            raise InvalidValueError(f"{where}: tensor {key[len(prefix):]!r} is missing "
                                    f"({damaged})")


@dataclasses.dataclass(frozen=True)
class FileState:
    """A checkpoint read and checked against itself (not yet against a context)."""

    snapshot: Snapshot
    epoch: int
    permutation: np.ndarray | None
    schedule: dict[str, object] | None
    run: dict[str, object]

    @property
    def where(self) -> str:
        return self.snapshot.where


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


def _label(names: list[str], field: str, name: str) -> str:
    i = names.index(name)
    key, what = {"m": (m_key(i), "AdamW m"), "v": (v_key(i), "AdamW v"),
                 "acc": (acc_key(i), "gradient accumulator")}[field]
    return f"tensor {key!r} ({what} of {name!r})"


def read_file(path: str | os.PathLike[str]) -> FileState:
    """Read the whole file, verify its checksums and check its internal consistency."""
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
    _verify(metadata, tensors, where)
    names: list[str] = _meta(metadata, STATE + "params", list, where)
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ShapeError(f"{where}: metadata {STATE + 'params'!r}: expected unique parameter "
                         f"names, got {names!r}")
    for name in names:
        if name not in tensors:
            raise ShapeError(f"{where}: tensor of parameter {name!r} is missing")
    if RNG not in tensors or tensors[RNG].dtype != np.int32:
        raise ShapeError(f"{where}: tensor {RNG!r} (I32) is missing")
    words = tensors[RNG].reshape(-1).view(np.uint32)
    try:
        Mt19937().set_state(words)  # checks the words
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
    run = {k[len(RUN):]: v for k, v in metadata.items() if k.startswith(RUN)}
    opt_period = _count(metadata, STATE + "opt_period", where, 1)
    opt_i = _count(metadata, STATE + "opt_i", where)
    if opt_i >= opt_period:
        raise ShapeError(f"{where}: opt_i: expected < opt_period={opt_period}, got {opt_i}")
    has_accs = acc_key(0) in tensors
    snapshot = Snapshot(
        where=where,
        setup={"optimizer": _meta(metadata, STATE + "optimizer", str, where),
               "loss type": _meta(metadata, STATE + "loss_type", str, where),
               "build type": _meta(metadata, STATE + "build_type", str, where),
               "opt_period": opt_period},
        names=names,
        params={name: tensors[name] for name in names},
        moments={name: (tensors.get(m_key(i)), tensors.get(v_key(i)))
                 for i, name in enumerate(names)},
        accumulators={name: tensors.get(acc_key(i)) for i, name in enumerate(names)}
        if has_accs else None,
        loss_acc=tensors.get(LOSS_ACC),
        counters=Counters(_count(metadata, STATE + "iteration", where, 1), opt_i,
                          _meta(metadata, STATE + "period_complete", bool, where)),
        rng=words.copy(),
        label=functools.partial(_label, names),
    )
    return FileState(snapshot, _count(metadata, STATE + "epoch", where), permutation,
                     schedule or None, run)
