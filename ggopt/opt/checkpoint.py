"""Checkpoints: an optimization's whole state in one GGUF file, written atomically.

A checkpoint holds everything a run needs to continue bit for bit: the parameters, the AdamW
moments, the optimizer step count, the position in the accumulation period with the partial
gradient accumulators, the shuffle generator (``std::mt19937``) and the dataset's shard order,
the caller's epoch and a learning-rate schedule's position. :func:`load_state` reads and checks
the whole file against the context before it changes anything.

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
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

from ..backend import tensor_get, tensor_set
from ..errors import DTypeError, ShapeError, StateError
from ..io import gguf
from ..tensor import Tensor
from ..types import TensorFlag
from .dataset import Dataset
from .enums import BuildType, OptimizerType, optimizer_name
from .rng import Mt19937
from .schedule import Schedule

if TYPE_CHECKING:
    from ..dist import Communicator
    from .context import OptContext

__all__ = ["FORMAT_VERSION", "ARCHITECTURE", "save_state", "load_state"]

FORMAT_VERSION = 1
ARCHITECTURE = "ggopt-state"

_ARCH_KEY = "general.architecture"
_STATE = "ggopt.state."
_SCHEDULE = "ggopt.schedule."
_RNG = "ggopt.rng"
_PERMUTATION = "ggopt.dataset.permutation"
_LOSS_ACC = "ggopt.grad_acc.loss"
_RESERVED = "ggopt."
_T = TypeVar("_T")


def _m(i: int) -> str:
    return f"ggopt.adamw_m.{i}"


def _v(i: int) -> str:
    return f"ggopt.adamw_v.{i}"


def _acc(i: int) -> str:
    return f"ggopt.grad_acc.{i}"


# --- the context's state: the only code that knows OptContext's private attributes ----------
def _setup(ctx: OptContext) -> dict[str, object]:
    """What a checkpoint must agree on: optimizer, loss type, build type, opt_period."""
    return {"optimizer": optimizer_name(ctx._optimizer), "loss type": ctx._loss_type.name,
            "build type": ctx._build_type_alloc.name, "opt_period": ctx._opt_period}


def _has_moments(ctx: OptContext) -> bool:
    return ctx._optimizer is OptimizerType.ADAMW and ctx._build_type_alloc is BuildType.OPT


def _built(ctx: OptContext) -> bool:
    """Whether the accumulators and moments exist (static: always; dynamic: after an alloc)."""
    return ctx._static_allocated


def _prepared_graph_nodes(ctx: OptContext) -> list[Tensor] | None:
    """Dynamic graphs: the nodes of the graph given to prepare_alloc, if any."""
    return None if ctx._gf is None else list(ctx._gf.nodes)


def _param_nodes(ctx: OptContext) -> list[Tensor]:
    """The nodes holding the parameters of a built context, in graph order."""
    if ctx._static_graphs and ctx._gf is not None:
        return list(ctx._gf.nodes)
    return list(ctx._param_accs)


def _moments(ctx: OptContext) -> dict[Tensor, tuple[Tensor, Tensor]]:
    return ctx._moments


def _param_accs(ctx: OptContext) -> dict[Tensor, Tensor]:
    return ctx._param_accs


def _loss_acc(ctx: OptContext) -> Tensor | None:
    return ctx._loss_acc


def _counters(ctx: OptContext) -> tuple[int, int, bool]:
    return ctx._iter, ctx._opt_i, ctx._period_complete


def _set_counters(ctx: OptContext, iteration: int, opt_i: int, period_complete: bool) -> None:
    ctx._iter, ctx._opt_i, ctx._period_complete = iteration, opt_i, period_complete


def _own_schedule(ctx: OptContext) -> Schedule | None:
    """The context's ``get_opt_pars`` when it is a schedule."""
    get_opt_pars = ctx._get_opt_pars
    return get_opt_pars if isinstance(get_opt_pars, Schedule) else None


def _comm(ctx: OptContext) -> Communicator | None:
    """The communicator of a data-parallel context, else None."""
    return ctx.comm


def _set_pending(ctx: OptContext, pending: PendingState | None) -> None:
    ctx._pending_state = pending


def _check_usable(ctx: OptContext, fn: str) -> None:
    ctx._check_open(fn)
    if ctx._build_type_alloc is BuildType.FORWARD:
        raise StateError(f"a FORWARD-only context has no optimizer state to checkpoint; save "
                         f"the weights with ggopt.io.gguf.save ({fn})")
    if ctx._eval_ready:
        raise StateError(f"a graph is allocated and waiting for eval; checkpoint between "
                         f"evals ({fn})")


def _graph_params(nodes: list[Tensor], fn: str) -> list[Tensor]:
    params = [n for n in nodes if n.flags & TensorFlag.PARAM]
    seen: set[str] = set()
    for p in params:
        if not p.name or p.name in seen or p.name.startswith(_RESERVED):
            raise StateError(
                f"checkpoints need unique parameter names that do not start with "
                f"{_RESERVED!r}; parameter {p.name!r} breaks this (set_name) ({fn})"
            )
        seen.add(p.name)
    return params


def _params(ctx: OptContext, fn: str) -> list[Tensor]:
    return _graph_params(_param_nodes(ctx), fn)


def _resolve_schedule(ctx: OptContext, schedule: Schedule | None, fn: str) -> Schedule | None:
    if schedule is None:
        return _own_schedule(ctx)
    if schedule is not None and not isinstance(schedule, Schedule):
        raise DTypeError(f"schedule must be a ggopt.opt.schedule.Schedule or None, got "
                         f"{type(schedule).__name__} ({fn})")
    return schedule


def _check_dataset(dataset: Dataset | None, fn: str) -> None:
    if dataset is not None and not isinstance(dataset, Dataset):
        raise DTypeError(f"dataset must be a Dataset or None, got {type(dataset).__name__} ({fn})")


# --- save ----------------------------------------------------------------------------------
def save_state(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None = None,
               schedule: Schedule | None = None, *, epoch: int = 0) -> None:
    """Write ``ctx``'s state (and ``dataset``'s shard order, ``schedule``'s position) to ``path``.

    See :meth:`OptContext.save_state`. Data-parallel contexts: collective; rank 0 writes.
    """
    fn = "ggml_opt_save_state"
    comm = _comm(ctx)
    if comm is None:
        _save(ctx, path, dataset, schedule, epoch, fn, write=True)
    else:
        comm.run_all(fn, lambda: _save(ctx, path, dataset, schedule, epoch, fn,
                                       write=comm.rank == 0, every_rank_raises=True))


def _save(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None,
          schedule: Schedule | None, epoch: object, fn: str, *, write: bool,
          every_rank_raises: bool = False) -> None:
    _check_usable(ctx, fn)
    _check_dataset(dataset, fn)
    schedule = _resolve_schedule(ctx, schedule, fn)
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ShapeError(f"epoch must be an int >= 0, got {epoch!r} ({fn})")
    if not _built(ctx):
        raise StateError(f"dynamic graphs: nothing to save before the first alloc ({fn})")
    params = _params(ctx, fn)
    if _comm(ctx) is not None and _counters(ctx)[1] != 0:
        raise StateError(f"data-parallel: the ranks hold different partial gradients inside "
                         f"an optimizer period; save at the end of one ({fn})")
    if not write:
        return

    setup = _setup(ctx)
    iteration, opt_i, period_complete = _counters(ctx)
    metadata: dict[str, object] = {
        _ARCH_KEY: ARCHITECTURE,
        _STATE + "version": FORMAT_VERSION,
        _STATE + "optimizer": setup["optimizer"],
        _STATE + "loss_type": setup["loss type"],
        _STATE + "build_type": setup["build type"],
        _STATE + "opt_period": setup["opt_period"],
        _STATE + "iteration": iteration,
        _STATE + "opt_i": opt_i,
        _STATE + "period_complete": period_complete,
        _STATE + "epoch": int(epoch),
        _STATE + "params": [p.name for p in params],
    }
    tensors: dict[str, np.ndarray] = {}
    moments, accs, loss_acc = _moments(ctx), _param_accs(ctx), _loss_acc(ctx)
    for i, p in enumerate(params):
        tensors[p.name] = tensor_get(p)
        if p in moments:
            m, v = moments[p]
            tensors[_m(i)], tensors[_v(i)] = tensor_get(m), tensor_get(v)
        if p in accs:
            tensors[_acc(i)] = tensor_get(accs[p])
    if loss_acc is not None:
        tensors[_LOSS_ACC] = tensor_get(loss_acc)
    tensors[_RNG] = ctx.rng.get_state().view(np.int32)
    if dataset is not None:
        tensors[_PERMUTATION] = dataset.permutation.astype(np.int32)
    if schedule is not None:
        metadata.update({_SCHEDULE + k: v for k, v in schedule.state().items()})
    try:
        gguf.save(path, tensors, metadata)  # atomic: temporary file, fsync, rename
    except OSError as exc:
        if not every_rank_raises:
            raise
        raise StateError(f"rank 0 could not write {os.fspath(path)!r}: {exc} ({fn})") from exc


# --- load ----------------------------------------------------------------------------------
@dataclasses.dataclass
class _FileState:
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
        return _acc(0) in self.tensors


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


def _read(path: str | os.PathLike[str]) -> _FileState:
    """Read the whole file and check its internal consistency."""
    spath = os.fspath(path)
    where = f"load_state {spath!r} (ggml_opt_load_state)"
    metadata, tensors = gguf.load(spath)
    arch = metadata.get(_ARCH_KEY)
    if arch != ARCHITECTURE:
        raise ShapeError(f"{where}: {_ARCH_KEY}: expected {ARCHITECTURE!r} (a ggopt "
                         f"checkpoint), got {arch!r}")
    version = _meta(metadata, _STATE + "version", int, where)
    if version != FORMAT_VERSION:
        raise ShapeError(f"{where}: format version: expected {FORMAT_VERSION}, got {version} "
                         f"(written by another ggopt version)")
    names: list[str] = _meta(metadata, _STATE + "params", list, where)
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ShapeError(f"{where}: metadata {_STATE + 'params'!r}: expected unique parameter "
                         f"names, got {names!r}")
    for name in names:
        if name not in tensors:
            raise ShapeError(f"{where}: tensor of parameter {name!r} is missing")
    if _RNG not in tensors or tensors[_RNG].dtype != np.int32:
        raise ShapeError(f"{where}: tensor {_RNG!r} (I32) is missing")
    rng = Mt19937()
    try:
        rng.set_state(tensors[_RNG].reshape(-1).view(np.uint32))
    except ShapeError as exc:
        raise ShapeError(f"{where}: tensor {_RNG!r}: {exc}") from None
    permutation = tensors.get(_PERMUTATION)
    if permutation is not None:
        permutation = permutation.reshape(-1)
        if permutation.dtype != np.int32 or not np.array_equal(
                np.sort(permutation), np.arange(len(permutation))):
            raise ShapeError(f"{where}: tensor {_PERMUTATION!r}: expected an I32 permutation "
                             f"of 0..n-1")
    schedule = {k[len(_SCHEDULE):]: v for k, v in metadata.items() if k.startswith(_SCHEDULE)}
    opt_period = _count(metadata, _STATE + "opt_period", where, 1)
    opt_i = _count(metadata, _STATE + "opt_i", where)
    if opt_i >= opt_period:
        raise ShapeError(f"{where}: opt_i: expected < opt_period={opt_period}, got {opt_i}")
    return _FileState(
        path=spath,
        optimizer=_meta(metadata, _STATE + "optimizer", str, where),
        loss_type=_meta(metadata, _STATE + "loss_type", str, where),
        build_type=_meta(metadata, _STATE + "build_type", str, where),
        opt_period=opt_period,
        iteration=_count(metadata, _STATE + "iteration", where, 1),
        opt_i=opt_i,
        period_complete=_meta(metadata, _STATE + "period_complete", bool, where),
        epoch=_count(metadata, _STATE + "epoch", where),
        names=names,
        tensors=tensors,
        rng=rng,
        permutation=permutation,
        schedule=schedule or None,
    )


def _check_setup(ctx: OptContext, st: _FileState) -> None:
    """The file was written by a context of the same optimizer, loss, build and period."""
    theirs_by_name = {"optimizer": st.optimizer, "loss type": st.loss_type,
                      "build type": st.build_type, "opt_period": st.opt_period}
    for what, ours in _setup(ctx).items():
        theirs = theirs_by_name[what]
        if ours != theirs:
            raise ShapeError(f"{st.where}: {what}: the context has {ours!r}, the file "
                             f"{theirs!r}")


def _check_tensor(st: _FileState, key: str, like: Tensor, label: str) -> None:
    arr = st.tensors.get(key)
    if arr is None:
        raise ShapeError(f"{st.where}: tensor {key!r} ({label}) is missing")
    if arr.shape != like.shape:
        raise ShapeError(f"{st.where}: {label}: expected ggml shape {list(like.shape[::-1])}, "
                         f"the file has {list(arr.shape[::-1])}")
    if arr.dtype != like.type.dtype:
        raise DTypeError(f"{st.where}: {label}: expected {like.type.name}, the file has "
                         f"{arr.dtype}")


def _check_params(ctx: OptContext, st: _FileState, params: list[Tensor]) -> None:
    """Names, shapes and types of the parameters (and of their moments and accumulators)."""
    ours = [p.name for p in params]
    for name in ours:
        if name not in st.names:
            raise ShapeError(f"{st.where}: parameter {name!r} of the context is not in the file "
                             f"(it holds {', '.join(st.names)})")
    for name in st.names:
        if name not in ours:
            raise ShapeError(f"{st.where}: parameter {name!r} of the file is not in the context "
                             f"(it has {', '.join(ours)})")
    index = {name: i for i, name in enumerate(st.names)}
    adamw = _has_moments(ctx)
    for p in params:
        i = index[p.name]
        _check_tensor(st, p.name, p, f"parameter {p.name!r}")
        if adamw:
            _check_tensor(st, _m(i), p, f"AdamW m of {p.name!r}")
            _check_tensor(st, _v(i), p, f"AdamW v of {p.name!r}")
        if st.has_accumulators():
            _check_tensor(st, _acc(i), p, f"gradient accumulator of {p.name!r}")
        elif st.opt_i != 0:
            raise ShapeError(f"{st.where}: the file stops inside an accumulation period "
                             f"(opt_i={st.opt_i}) but holds no gradient accumulators")


def _check_extras(st: _FileState, dataset: Dataset | None,
                  schedule: Schedule | None) -> tuple[int, int] | None:
    """Dataset and schedule against the file; returns the schedule's ``(step, epoch)``."""
    if dataset is None and st.permutation is not None:
        raise ShapeError(f"{st.where}: dataset: the file holds a shard order but no dataset "
                         f"was given")
    if dataset is not None and st.permutation is None:
        raise ShapeError(f"{st.where}: dataset: a dataset was given but the file holds no "
                         f"shard order")
    if dataset is not None and st.permutation is not None \
            and len(st.permutation) != dataset.nshards:
        raise ShapeError(f"{st.where}: dataset: expected {dataset.nshards} shards, the file's "
                         f"shard order has {len(st.permutation)}")
    if schedule is None and st.schedule is not None:
        raise ShapeError(f"{st.where}: schedule: the file holds a {st.schedule.get('kind')!r} "
                         f"schedule but none was given")
    if schedule is not None and st.schedule is None:
        raise ShapeError(f"{st.where}: schedule: a {schedule.kind!r} schedule was given but "
                         f"the file holds none")
    if schedule is None or st.schedule is None:
        return None
    return schedule.check_state(st.schedule, st.where)


def _apply_counters(ctx: OptContext, st: _FileState) -> None:
    _set_counters(ctx, st.iteration, st.opt_i, st.period_complete)


def _apply_tensors(ctx: OptContext, st: _FileState, params: list[Tensor]) -> None:
    index = {name: i for i, name in enumerate(st.names)}
    moments, accs, loss_acc = _moments(ctx), _param_accs(ctx), _loss_acc(ctx)
    for p in params:
        i = index[p.name]
        tensor_set(p, st.tensors[p.name])
        if p in moments:
            m, v = moments[p]
            tensor_set(m, st.tensors[_m(i)])
            tensor_set(v, st.tensors[_v(i)])
        if p in accs:
            acc = accs[p]
            if st.has_accumulators():
                tensor_set(acc, st.tensors[_acc(i)])
            else:  # saved at a period boundary by a context without accumulators
                tensor_set(acc, np.zeros(acc.nelements(), dtype=np.float32))
    if loss_acc is not None and _LOSS_ACC in st.tensors:
        tensor_set(loss_acc, st.tensors[_LOSS_ACC].reshape(-1))


class PendingState:
    """A checkpoint loaded into a dynamic context before its first build.

    :meth:`OptContext.alloc` calls :meth:`begin` before choosing the graph (it checks the
    prepared graph's parameters against the file and sets the counters) and :meth:`finish`
    right after the first build (it fills the new accumulators and moments).
    """

    def __init__(self, st: _FileState) -> None:
        self._st = st

    def begin(self, ctx: OptContext) -> None:
        nodes = _prepared_graph_nodes(ctx) or []
        _check_params(ctx, self._st, _graph_params(nodes, "ggml_opt_alloc"))
        _apply_counters(ctx, self._st)

    def finish(self, ctx: OptContext) -> None:
        _apply_tensors(ctx, self._st, _params(ctx, "ggml_opt_alloc"))


def load_state(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None = None,
               schedule: Schedule | None = None) -> int:
    """Read ``path`` into ``ctx`` (and ``dataset``, ``schedule``); return the saved epoch.

    See :meth:`OptContext.load_state`. Data-parallel contexts: collective; every rank reads the
    file, and every rank raises (nothing changed anywhere) when any rank's check fails.
    """
    fn = "ggml_opt_load_state"
    comm = _comm(ctx)
    if comm is None:
        return _prepare_load(ctx, path, dataset, schedule, fn)()
    apply: Callable[[], int] = comm.run_all(
        fn, lambda: _prepare_load(ctx, path, dataset, schedule, fn))
    return apply()


def _prepare_load(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None,
                  schedule: Schedule | None, fn: str) -> Callable[[], int]:
    """Read and check everything; return the function that applies it (and cannot fail)."""
    _check_usable(ctx, fn)
    _check_dataset(dataset, fn)
    schedule = _resolve_schedule(ctx, schedule, fn)
    try:
        st = _read(path)
    except OSError as exc:
        if _comm(ctx) is None:
            raise
        raise StateError(f"cannot read {os.fspath(path)!r}: {exc} ({fn})") from exc
    _check_setup(ctx, st)
    if _comm(ctx) is not None and st.opt_i != 0:
        raise ShapeError(f"{st.where}: data-parallel: the file stops inside an optimizer "
                         f"period (opt_i={st.opt_i}); resume it in one process")
    params = None
    prepared = _prepared_graph_nodes(ctx)
    if _built(ctx):
        params = _params(ctx, fn)
        _check_params(ctx, st, params)
    elif prepared is not None:  # dynamic, not built yet: check now, fill at the first alloc
        _check_params(ctx, st, _graph_params(prepared, fn))
    position = _check_extras(st, dataset, schedule)

    def apply() -> int:
        if params is not None:
            _apply_tensors(ctx, st, params)
            _apply_counters(ctx, st)
            _set_pending(ctx, None)
        else:
            _set_pending(ctx, PendingState(st))
        ctx.rng.set_state(st.rng.get_state())
        if dataset is not None and st.permutation is not None:
            dataset._permutation[:] = st.permutation
        if schedule is not None and position is not None:
            schedule.step, schedule.epoch = position
        return st.epoch

    return apply
