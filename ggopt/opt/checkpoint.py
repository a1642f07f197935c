"""Checkpoints: an optimization's whole state in one GGUF file, written atomically.

A checkpoint holds everything a run needs to continue bit for bit: the parameters, the AdamW
moments, the optimizer step count, the position in the accumulation period with the partial
gradient accumulators, the shuffle generator (``std::mt19937``) and the dataset's shard order,
the caller's epoch and a learning-rate schedule's position. :func:`load_state` reads and checks
the whole file against the context before it changes anything.

The file's layout: :mod:`ggopt.opt.checkpoint_file`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

import numpy as np

from ..backend import tensor_get, tensor_set
from ..errors import DTypeError, InvalidValueError, ShapeError, StateError
from ..io import gguf
from ..tensor import Tensor
from ..types import FLAG_PARAM
from .checkpoint_file import (
    ARCH_KEY,
    ARCHITECTURE,
    FORMAT_VERSION,
    LOSS_ACC,
    PERMUTATION,
    RESERVED,
    RNG,
    SCHEDULE,
    STATE,
    FileState,
    acc_key,
    m_key,
    read_file,
    v_key,
)
from .enums import BuildType, OptimizerType, optimizer_name
from .schedule import Schedule

if TYPE_CHECKING:
    from ..distributed import Communicator
    from .build import Persistent
    from .context import OptContext
    from .dataset import Dataset

__all__ = ["FORMAT_VERSION", "ARCHITECTURE", "Checkpointing", "save_state", "load_state"]

# --- the context's state: the only code that knows OptContext's private attributes ----------
def _setup(ctx: OptContext) -> dict[str, object]:
    """What a checkpoint must agree on: optimizer, loss type, build type, opt_period."""
    spec = ctx._spec
    return {"optimizer": optimizer_name(spec.optimizer), "loss type": spec.loss_type.name,
            "build type": spec.build_type.name, "opt_period": spec.opt_period}


def _has_moments(ctx: OptContext) -> bool:
    spec = ctx._spec
    return spec.optimizer is OptimizerType.ADAMW and spec.build_type is BuildType.OPT


def _persistent(ctx: OptContext) -> Persistent:
    """The accumulators, moments and step parameters (the context is open)."""
    if ctx._persist is None:
        raise StateError("the optimization context is closed")
    return ctx._persist


def _built(ctx: OptContext) -> bool:
    """Whether the accumulators and moments exist (static: always; dynamic: after an alloc)."""
    return ctx._persist is not None and ctx._persist.allocated


def _prepared_graph_nodes(ctx: OptContext) -> list[Tensor] | None:
    """Dynamic graphs: the nodes of the graph given to prepare_alloc, if any."""
    return None if ctx._next_gf is None else list(ctx._next_gf.nodes)


def _param_nodes(ctx: OptContext) -> list[Tensor]:
    """The nodes holding the parameters of a built context, in graph order."""
    if ctx._spec.static_graphs and ctx._b is not None:
        return list(ctx._b.gf.nodes)
    return list(_persistent(ctx).param_accs)


def _moments(ctx: OptContext) -> dict[Tensor, tuple[Tensor, Tensor]]:
    return _persistent(ctx).moments


def _param_accs(ctx: OptContext) -> dict[Tensor, Tensor]:
    return _persistent(ctx).param_accs


def _loss_acc(ctx: OptContext) -> Tensor | None:
    return _persistent(ctx).loss_acc


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


@contextlib.contextmanager
def _holding_locks(ctx: OptContext) -> Iterator[None]:
    """The scheduler's lock, then the context's, as every OptContext call holds them."""
    with ctx._spec.sched, ctx._lock:
        yield


def _check_usable(ctx: OptContext, fn: str) -> None:
    ctx._check_open(fn)
    if ctx._spec.build_type is BuildType.FORWARD:
        raise StateError(f"a FORWARD-only context has no optimizer state to checkpoint; save "
                         f"the weights with ggopt.io.gguf.save ({fn})")
    if ctx._eval_ready:
        raise StateError(f"a graph is allocated and waiting for eval; checkpoint between "
                         f"evals ({fn})")


def _graph_params(nodes: list[Tensor], fn: str) -> list[Tensor]:
    params = [n for n in nodes if n.flags & FLAG_PARAM]
    seen: set[str] = set()
    for p in params:
        if not p.name or p.name in seen or p.name.startswith(RESERVED):
            raise StateError(
                f"checkpoints need unique parameter names that do not start with "
                f"{RESERVED!r}; parameter {p.name!r} breaks this (set_name) ({fn})"
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
    from .dataset import Dataset  # the dataset module imports the context, which imports this

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
        raise InvalidValueError(f"epoch must be an int >= 0, got {epoch!r} ({fn})")
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
        ARCH_KEY: ARCHITECTURE,
        STATE + "version": FORMAT_VERSION,
        STATE + "optimizer": setup["optimizer"],
        STATE + "loss_type": setup["loss type"],
        STATE + "build_type": setup["build type"],
        STATE + "opt_period": setup["opt_period"],
        STATE + "iteration": iteration,
        STATE + "opt_i": opt_i,
        STATE + "period_complete": period_complete,
        STATE + "epoch": int(epoch),
        STATE + "params": [p.name for p in params],
    }
    tensors: dict[str, np.ndarray] = {}
    moments, accs, loss_acc = _moments(ctx), _param_accs(ctx), _loss_acc(ctx)
    for i, p in enumerate(params):
        tensors[p.name] = tensor_get(p)
        if p in moments:
            m, v = moments[p]
            tensors[m_key(i)], tensors[v_key(i)] = tensor_get(m), tensor_get(v)
        if p in accs:
            tensors[acc_key(i)] = tensor_get(accs[p])
    if loss_acc is not None:
        tensors[LOSS_ACC] = tensor_get(loss_acc)
    tensors[RNG] = ctx.rng.get_state().view(np.int32)
    if dataset is not None:
        tensors[PERMUTATION] = dataset.permutation.astype(np.int32)
    if schedule is not None:
        metadata.update({SCHEDULE + k: v for k, v in schedule.state().items()})
    try:
        gguf.save(path, tensors, metadata)  # atomic: temporary file, fsync, rename
    except OSError as exc:
        if not every_rank_raises:
            raise
        raise StateError(f"rank 0 could not write {os.fspath(path)!r}: {exc} ({fn})") from exc


# --- load ----------------------------------------------------------------------------------
def _check_setup(ctx: OptContext, st: FileState) -> None:
    """The file was written by a context of the same optimizer, loss, build and period."""
    theirs_by_name = {"optimizer": st.optimizer, "loss type": st.loss_type,
                      "build type": st.build_type, "opt_period": st.opt_period}
    for what, ours in _setup(ctx).items():
        theirs = theirs_by_name[what]
        if ours != theirs:
            raise ShapeError(f"{st.where}: {what}: the context has {ours!r}, the file "
                             f"{theirs!r}")


def _check_tensor(st: FileState, key: str, like: Tensor, label: str) -> None:
    arr = st.tensors.get(key)
    if arr is None:
        raise ShapeError(f"{st.where}: tensor {key!r} ({label}) is missing")
    if arr.shape != like.shape:
        raise ShapeError(f"{st.where}: {label}: expected ggml shape {list(like.shape[::-1])}, "
                         f"the file has {list(arr.shape[::-1])}")
    if arr.dtype != like.type.dtype:
        raise DTypeError(f"{st.where}: {label}: expected {like.type.name}, the file has "
                         f"{arr.dtype}")


def _check_params(ctx: OptContext, st: FileState, params: list[Tensor]) -> None:
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
            _check_tensor(st, m_key(i), p, f"AdamW m of {p.name!r}")
            _check_tensor(st, v_key(i), p, f"AdamW v of {p.name!r}")
        if st.has_accumulators():
            _check_tensor(st, acc_key(i), p, f"gradient accumulator of {p.name!r}")
        elif st.opt_i != 0:
            raise ShapeError(f"{st.where}: the file stops inside an accumulation period "
                             f"(opt_i={st.opt_i}) but holds no gradient accumulators")


def _check_extras(st: FileState, dataset: Dataset | None,
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


def _apply_counters(ctx: OptContext, st: FileState) -> None:
    _set_counters(ctx, st.iteration, st.opt_i, st.period_complete)


def _apply_tensors(ctx: OptContext, st: FileState, params: list[Tensor]) -> None:
    index = {name: i for i, name in enumerate(st.names)}
    moments, accs, loss_acc = _moments(ctx), _param_accs(ctx), _loss_acc(ctx)
    for p in params:
        i = index[p.name]
        tensor_set(p, st.tensors[p.name])
        if p in moments:
            m, v = moments[p]
            tensor_set(m, st.tensors[m_key(i)])
            tensor_set(v, st.tensors[v_key(i)])
        if p in accs:
            acc = accs[p]
            if st.has_accumulators():
                tensor_set(acc, st.tensors[acc_key(i)])
            else:  # saved at a period boundary by a context without accumulators
                tensor_set(acc, np.zeros(acc.nelements(), dtype=np.float32))
    if loss_acc is not None and LOSS_ACC in st.tensors:
        tensor_set(loss_acc, st.tensors[LOSS_ACC].reshape(-1))


class PendingState:
    """A checkpoint loaded into a dynamic context before its first build.

    :meth:`OptContext.alloc` calls :meth:`begin` before choosing the graph (it checks the
    prepared graph's parameters against the file and sets the counters) and :meth:`finish`
    right after the first build (it fills the new accumulators and moments).
    """

    def __init__(self, st: FileState) -> None:
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
        st = read_file(path)
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


class Checkpointing:
    """:meth:`save_state` and :meth:`load_state` of :class:`~ggopt.opt.OptContext`."""

    def save_state(self, path: str | os.PathLike[str],
                   dataset: Dataset | None = None, schedule: Schedule | None = None, *,
                   epoch: int = 0) -> None:
        """Write the whole optimization state to the GGUF file ``path``, atomically.

        Saves the parameters, AdamW moments, step count, accumulation position with the
        partial gradient accumulators and the shuffle generator; with ``dataset`` its shard
        order, with ``schedule`` (default: ``get_opt_pars`` when it is a
        :class:`~ggopt.opt.schedule.Schedule`) its position; ``epoch`` is stored for the
        caller. The file is written as a temporary file beside ``path``, fsynced and renamed
        (:mod:`ggopt.io.atomic`), so a crash leaves the previous checkpoint intact. Layout:
        :mod:`ggopt.opt.checkpoint_file`.

        Data-parallel contexts: collective; rank 0 writes, and an error on any rank (an
        ``OSError`` of rank 0 becomes a :class:`StateError`) raises on every rank. Saving
        inside an optimizer period is refused there.

        Raises
        ------
        StateError
            A FORWARD-only context, a graph waiting for eval, dynamic graphs before the first
            alloc, or parameters without unique names.

        ggml: none yet; named after the proposed ``ggml_opt_save_state``.
        """
        ctx = cast("OptContext", self)
        with _holding_locks(ctx):
            save_state(ctx, path, dataset, schedule, epoch=epoch)

    def load_state(self, path: str | os.PathLike[str],
                   dataset: Dataset | None = None, schedule: Schedule | None = None) -> int:
        """Restore a state written by :meth:`save_state`; return the epoch stored with it.

        The whole file is read and checked first: format version, optimizer, loss, build type,
        ``opt_period``, parameter names, shapes and types, and that a dataset (shard count)
        and a schedule (kind and constants) are given exactly when the file holds them. The
        first mismatch raises and nothing changes. A dynamic context that has not built a
        graph yet keeps the tensors until its first :meth:`alloc`, which checks the prepared
        graph's parameters against the file before anything else. Data-parallel contexts:
        collective; every rank reads the file and applies it only when every rank's checks
        passed.

        Raises
        ------
        ShapeError, DTypeError
            The file is truncated, not a ggopt checkpoint, of another format version, or does
            not match the context, dataset or schedule (the message names the mismatch).
        StateError
            As for :meth:`save_state`.

        ggml: none yet; named after the proposed ``ggml_opt_load_state``.
        """
        ctx = cast("OptContext", self)
        with _holding_locks(ctx):
            return load_state(ctx, path, dataset, schedule)
