"""Checkpoints: an optimization's whole state in one GGUF file, written atomically.

A checkpoint holds everything a run needs to continue bit for bit: the parameters, the AdamW
moments, the optimizer step count, the position in the accumulation period with the partial
gradient accumulators, the shuffle generator (``std::mt19937``) and the dataset's shard order,
the caller's epoch, a learning-rate schedule's position and what the run depends on (``run``:
batch sizes, split, a digest of the data), with a checksum per tensor. :func:`load_state`
reads the whole file, verifies the checksums, checks everything against the context, dataset,
schedule and run, and only then commits (one :class:`~ggopt.io.staging.Staging`).

The file's layout: :mod:`ggopt.opt.checkpoint_file`. The context's side:
:meth:`OptContext.state` and :meth:`OptContext.stage_load` (:mod:`ggopt.opt.state`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

import numpy as np

from ..backend import tensor_get
from ..errors import DTypeError, InvalidValueError, ShapeError, StateError
from ..io.staging import Staging
from .checkpoint_file import (
    ARCH_KEY,
    ARCHITECTURE,
    FORMAT_VERSION,
    LOSS_ACC,
    PERMUTATION,
    RNG,
    RUN,
    SCHEDULE,
    STATE,
    FileState,
    acc_key,
    m_key,
    read_file,
    v_key,
    write_file,
)
from .enums import BuildType
from .schedule import Schedule
from .state import param_names, setup_of

if TYPE_CHECKING:
    from .context import OptContext
    from .dataset import Dataset

__all__ = ["FORMAT_VERSION", "ARCHITECTURE", "Checkpointing", "save_state", "load_state",
           "RunMismatchWarning"]

#: ``run``: what a run depends on, e.g. ``{"batch": 1000, "val_split": 0.05, "data": digest}``
Run = Mapping[str, "int | float | str | bool"]


class RunMismatchWarning(UserWarning):
    """A run resumed from a checkpoint of a different run (``force``): not bit-exact."""


def _check_usable(ctx: OptContext, fn: str) -> None:
    if ctx.closed:
        raise StateError(f"the optimization context is closed ({fn})")
    if ctx.spec.build_type is BuildType.FORWARD:
        raise StateError(f"a FORWARD-only context has no optimizer state to checkpoint; save "
                         f"the weights with ggopt.io.gguf.save ({fn})")
    if ctx.eval_pending:
        raise StateError(f"a graph is allocated and waiting for eval; checkpoint between "
                         f"evals ({fn})")


def _resolve_schedule(ctx: OptContext, schedule: Schedule | None, fn: str) -> Schedule | None:
    if schedule is None:
        return ctx.schedule
    if not isinstance(schedule, Schedule):
        raise DTypeError(f"schedule must be a ggopt.opt.schedule.Schedule or None, got "
                         f"{type(schedule).__name__} ({fn})")
    return schedule


def _check_dataset(dataset: Dataset | None, fn: str) -> None:
    from .dataset import Dataset  # the dataset module imports the context, which imports this

    if dataset is not None and not isinstance(dataset, Dataset):
        raise DTypeError(f"dataset must be a Dataset or None, got {type(dataset).__name__} ({fn})")


def _check_run(run: Run | None, fn: str) -> dict[str, object]:
    if run is None:
        return {}
    if not isinstance(run, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, (int, float, str, bool))
            for k, v in run.items()):
        raise DTypeError(f"run must map names to int, float, str or bool values, got {run!r} "
                         f"({fn})")
    return dict(run)


# --- save ----------------------------------------------------------------------------------
def save_state(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None = None,
               schedule: Schedule | None = None, *, epoch: int = 0,
               run: Run | None = None) -> None:
    """Write ``ctx``'s state (and ``dataset``'s shard order, ``schedule``'s position) to ``path``.

    See :meth:`OptContext.save_state`. Data-parallel contexts: collective; rank 0 writes.
    """
    fn = "ggml_opt_save_state"
    comm = ctx.comm
    if comm is None:
        _save(ctx, path, dataset, schedule, epoch, run, fn, write=True)
    else:
        comm.run_all(fn, lambda: _save(ctx, path, dataset, schedule, epoch, run, fn,
                                       write=comm.rank == 0, every_rank_raises=True))


def _save(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None,
          schedule: Schedule | None, epoch: object, run: Run | None, fn: str, *, write: bool,
          every_rank_raises: bool = False) -> None:
    _check_usable(ctx, fn)
    _check_dataset(dataset, fn)
    schedule = _resolve_schedule(ctx, schedule, fn)
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise InvalidValueError(f"epoch must be an int >= 0, got {epoch!r} ({fn})")
    run_record = _check_run(run, fn)
    state = ctx.state()
    if not state.built:
        raise StateError(f"dynamic graphs: nothing to save before the first alloc ({fn})")
    params = param_names(list(state.params), fn)
    counters = state.counters
    if ctx.comm is not None and counters.opt_i != 0:
        raise StateError(f"data-parallel: the ranks hold different partial gradients inside "
                         f"an optimizer period; save at the end of one ({fn})")
    if not write:
        return

    setup = setup_of(ctx.spec)
    metadata: dict[str, object] = {
        ARCH_KEY: ARCHITECTURE,
        STATE + "version": FORMAT_VERSION,
        STATE + "optimizer": setup["optimizer"],
        STATE + "loss_type": setup["loss type"],
        STATE + "build_type": setup["build type"],
        STATE + "opt_period": setup["opt_period"],
        STATE + "iteration": counters.iteration,
        STATE + "opt_i": counters.opt_i,
        STATE + "period_complete": counters.period_complete,
        STATE + "epoch": int(epoch),
        STATE + "params": [p.name for p in params],
    }
    tensors: dict[str, np.ndarray] = {}
    moments, accs, loss_acc = state.moments, state.param_accs, state.loss_acc
    for i, p in enumerate(params):
        tensors[p.name] = tensor_get(p)
        if p in moments:
            m, v = moments[p]
            tensors[m_key(i)], tensors[v_key(i)] = tensor_get(m), tensor_get(v)
        if p in accs:
            tensors[acc_key(i)] = tensor_get(accs[p])
    if loss_acc is not None:
        tensors[LOSS_ACC] = tensor_get(loss_acc)
    tensors[RNG] = state.rng.get_state().view(np.int32)
    if dataset is not None:
        tensors[PERMUTATION] = dataset.permutation.astype(np.int32)
    if schedule is not None:
        metadata.update({SCHEDULE + k: v for k, v in schedule.state().items()})
    metadata.update({RUN + k: v for k, v in run_record.items()})
    try:
        write_file(path, metadata, tensors)  # atomic, with checksums
    except OSError as exc:
        if not every_rank_raises:
            raise
        raise StateError(f"rank 0 could not write {os.fspath(path)!r}: {exc} ({fn})") from exc


# --- load ----------------------------------------------------------------------------------
def _stage_extras(st: FileState, dataset: Dataset | None,
                  schedule: Schedule | None) -> Staging:
    """Dataset and schedule checked against the file; their changes staged."""
    staging = Staging(st.where)
    if dataset is None and st.permutation is not None:
        raise ShapeError(f"{st.where}: dataset: the file holds a shard order but no dataset "
                         f"was given")
    if dataset is not None and st.permutation is None:
        raise ShapeError(f"{st.where}: dataset: a dataset was given but the file holds no "
                         f"shard order")
    if dataset is not None and st.permutation is not None:
        if len(st.permutation) != dataset.nshards:
            raise ShapeError(f"{st.where}: dataset: expected {dataset.nshards} shards, the "
                             f"file's shard order has {len(st.permutation)}")
        perm, ds = st.permutation, dataset

        def order() -> Callable[[], None]:
            old = ds.permutation
            ds.set_permutation(perm)
            return lambda: ds.set_permutation(old)

        staging.change(order)
    if schedule is None and st.schedule is not None:
        raise InvalidValueError(f"{st.where}: schedule: the file holds a "
                                f"{st.schedule.get('kind')!r} schedule but none was given")
    if schedule is not None and st.schedule is None:
        raise InvalidValueError(f"{st.where}: schedule: a {schedule.kind!r} schedule was given "
                                f"but the file holds none")
    if schedule is not None and st.schedule is not None:
        step, epoch = schedule.check_state(st.schedule, st.where)
        sched = schedule

        def position() -> Callable[[], None]:
            old = sched.step, sched.epoch
            sched.step, sched.epoch = step, epoch

            def undo() -> None:
                sched.step, sched.epoch = old

            return undo

        staging.change(position)
    return staging


def _check_run_record(st: FileState, run: dict[str, object], force: bool) -> str:
    """The run the file was saved by against ``run`` (unchecked when ``run`` is empty):
    raises on a difference unless ``force``; returns the differences ("" for none)."""
    differ = [f"{k}: the file {st.run.get(k, 'not recorded')!r}, this run {v!r}"
              for k, v in run.items() if st.run.get(k) != v]
    what = "; ".join(differ)
    if what and not force:
        raise StateError(f"{st.where}: the checkpoint was saved by a different run ({what}); "
                         f"resuming would not be bit-exact. Resume it anyway with "
                         f"resume='force' (the CLIs: --resume-force)")
    return what


def load_state(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None = None,
               schedule: Schedule | None = None, *, run: Run | None = None,
               force: bool = False) -> int:
    """Read ``path`` into ``ctx`` (and ``dataset``, ``schedule``); return the saved epoch.

    See :meth:`OptContext.load_state`. Data-parallel contexts: collective; every rank reads the
    file, and every rank raises (nothing changed anywhere) when any rank's check fails.
    """
    fn = "ggml_opt_load_state"
    comm = ctx.comm
    if comm is None:
        return _prepare_load(ctx, path, dataset, schedule, run, force, fn)()
    apply: Callable[[], int] = comm.run_all(
        fn, lambda: _prepare_load(ctx, path, dataset, schedule, run, force, fn))
    return apply()


def _prepare_load(ctx: OptContext, path: str | os.PathLike[str], dataset: Dataset | None,
                  schedule: Schedule | None, run: Run | None, force: bool,
                  fn: str) -> Callable[[], int]:
    """Read and check everything; return the function that commits it (and cannot fail)."""
    _check_usable(ctx, fn)
    _check_dataset(dataset, fn)
    schedule = _resolve_schedule(ctx, schedule, fn)
    run_record = _check_run(run, fn)
    try:
        st = read_file(path)
    except OSError as exc:
        if ctx.comm is None:
            raise
        raise StateError(f"cannot read {os.fspath(path)!r}: {exc} ({fn})") from exc
    if ctx.comm is not None and st.snapshot.counters.opt_i != 0:
        raise ShapeError(f"{st.where}: data-parallel: the file stops inside an optimizer "
                         f"period (opt_i={st.snapshot.counters.opt_i}); resume it in one "
                         f"process")
    differ = _check_run_record(st, run_record, force)
    extras = _stage_extras(st, dataset, schedule)
    staging = ctx.stage_load(st.snapshot, extras)
    if differ:  # every check passed: say, once, what the forced resume gives up
        warnings.warn(f"{st.where}: resuming a different run ({differ}): the result is no "
                      f"longer bit-exact", RunMismatchWarning, stacklevel=5)

    def commit() -> int:
        staging.commit()
        return st.epoch

    return commit


class Checkpointing:
    """:meth:`save_state` and :meth:`load_state` of :class:`~ggopt.opt.OptContext`."""

    def save_state(self, path: str | os.PathLike[str],
                   dataset: Dataset | None = None, schedule: Schedule | None = None, *,
                   epoch: int = 0, run: Run | None = None) -> None:
        """Write the whole optimization state to the GGUF file ``path``, atomically.

        Saves the parameters, AdamW moments, step count, accumulation position with the
        partial gradient accumulators and the shuffle generator; with ``dataset`` its shard
        order, with ``schedule`` (default: ``get_opt_pars`` when it is a
        :class:`~ggopt.opt.schedule.Schedule`) its position; ``epoch`` is stored for the
        caller, ``run`` (names to int, float, str or bool: batch sizes, split, a data digest)
        too, for :meth:`load_state` to compare. Every tensor and the metadata get a checksum.
        The file is written as a temporary file beside ``path``, fsynced and renamed
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
        with ctx.locked():
            save_state(ctx, path, dataset, schedule, epoch=epoch, run=run)

    def load_state(self, path: str | os.PathLike[str],
                   dataset: Dataset | None = None, schedule: Schedule | None = None, *,
                   run: Run | None = None, force: bool = False) -> int:
        """Restore a state written by :meth:`save_state`; return the epoch stored with it.

        The whole file is read and checked first: checksums, format version, optimizer, loss,
        build type, ``opt_period``, parameter names, shapes and types of every tensor
        (moments and accumulators included), that a dataset (shard count) and a schedule
        (kind and constants) are given exactly when the file holds them, and with ``run``
        that the file was saved by the same run. The first mismatch raises and nothing
        changes; then everything is committed at once. ``force``: a different ``run`` only
        warns (:class:`RunMismatchWarning`; the result is no longer bit-exact).

        A dynamic context that has not built a graph yet checks the file against the graph
        given to :meth:`prepare_alloc` and restores the generator, shard order and schedule
        at once, the tensors at the first :meth:`alloc`. Without a prepared graph, all of it
        waits for the first alloc, which checks the graph first and, on a mismatch, raises
        and drops the loaded state (nothing changed; alloc works again). Data-parallel
        contexts: collective; every rank reads the file and applies it only when every
        rank's checks passed.

        Raises
        ------
        ShapeError, DTypeError
            The file is truncated, not a ggopt checkpoint, of another format version, or does
            not match the context, dataset or schedule (the message names file and field).
        InvalidValueError
            A checksum does not match: the file is damaged.
        StateError
            As for :meth:`save_state`; or saved by a different ``run`` (without ``force``).

        ggml: none yet; named after the proposed ``ggml_opt_load_state``.
        """
        ctx = cast("OptContext", self)
        with ctx.locked():
            return load_state(ctx, path, dataset, schedule, run=run, force=force)
