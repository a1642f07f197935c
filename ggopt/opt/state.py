"""An optimization's state as one object: what :meth:`OptContext.state` shows and
:meth:`OptContext.load` restores.

:class:`OptState` is the mutable state an :class:`~ggopt.opt.OptContext` owns: the persistent
tensors (gradient accumulators, AdamW moments, optimizer-step parameters; the parameters
themselves live in the graph), the counters, the shuffle generator and a pending load.
:class:`StateView` is the read-only view that checkpoints, data parallelism and the training
loops use; :class:`Snapshot` is a state as host arrays (a checkpoint's content), restored in one
transaction (:class:`ggopt.io.staging.Staging`): checked in full, then committed.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from ..backend import tensor_set
from ..errors import ShapeError, StateError
from ..io.staging import Staging
from ..tensor import Tensor
from ..types import FLAG_PARAM
from .build import Persistent, Spec
from .enums import BuildType, OptimizerType, optimizer_name
from .rng import Mt19937

__all__ = ["Counters", "Snapshot", "StateView", "OptState", "setup_of", "param_names"]

RESERVED = "ggopt."  # no parameter name may start with it (the checkpoint's own tensors do)


@dataclasses.dataclass(frozen=True)
class Counters:
    """Where the optimization is: the next optimizer step (1-based, AdamW bias correction),
    backward evals done in the current accumulation period, whether the last one ended it."""

    iteration: int = 1
    opt_i: int = 0
    period_complete: bool = False


def setup_of(spec: Spec) -> dict[str, object]:
    """What a restored state must agree on: optimizer, loss type, build type, opt_period."""
    return {"optimizer": optimizer_name(spec.optimizer), "loss type": spec.loss_type.name,
            "build type": spec.build_type.name, "opt_period": spec.opt_period}


def param_names(nodes: list[Tensor], where: str) -> list[Tensor]:
    """The parameters among ``nodes``; raises unless their names are unique and not reserved."""
    params = [n for n in nodes if n.flags & FLAG_PARAM]
    seen: set[str] = set()
    for p in params:
        if not p.name or p.name in seen or p.name.startswith(RESERVED):
            raise StateError(
                f"checkpoints need unique parameter names that do not start with "
                f"{RESERVED!r}; parameter {p.name!r} breaks this (set_name) ({where})"
            )
        seen.add(p.name)
    return params


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """An optimization's state as host arrays, checked against itself (not yet against a
    context). ``where`` names its origin in error messages."""

    where: str
    setup: dict[str, object]
    names: list[str]  # parameter names, in the saving context's order
    params: dict[str, np.ndarray]
    moments: dict[str, tuple[np.ndarray | None, np.ndarray | None]]  # AdamW m, v by name
    accumulators: dict[str, np.ndarray | None] | None  # None: saved without accumulators
    loss_acc: np.ndarray | None
    counters: Counters
    rng: np.ndarray  # Mt19937.get_state() words, valid
    #: ``label(field, name)``: how messages name field ``"param"``, ``"m"``, ``"v"`` or
    #: ``"acc"`` of parameter ``name`` (a file names its tensor)
    label: Callable[[str, str], str] = lambda field, name: f"{field} of {name!r}"

    def check_setup(self, spec: Spec) -> None:
        """Raise unless the snapshot was taken by a context of ``spec``'s setup."""
        for what, ours in setup_of(spec).items():
            theirs = self.setup.get(what)
            if ours != theirs:
                raise ShapeError(f"{self.where}: {what}: the context has {ours!r}, the file "
                                 f"{theirs!r}")

    def check_params(self, spec: Spec, params: list[Tensor]) -> Staging:
        """Check every field against ``params`` (the context's parameter nodes); return a
        staging holding no change yet (the caller stages what it can assign)."""
        staging = Staging(self.where)
        ours = [p.name for p in params]
        for name in ours:
            if name not in self.names:
                raise ShapeError(f"{self.where}: parameter {name!r} of the context is not in "
                                 f"the file (it holds {', '.join(self.names)})")
        for name in self.names:
            if name not in ours:
                raise ShapeError(f"{self.where}: parameter {name!r} of the file is not in the "
                                 f"context (it has {', '.join(ours)})")
        adamw = spec.optimizer is OptimizerType.ADAMW and spec.build_type is BuildType.OPT
        if self.accumulators is None and self.counters.opt_i != 0:
            raise ShapeError(f"{self.where}: the file stops inside an accumulation period "
                             f"(opt_i={self.counters.opt_i}) but holds no gradient "
                             f"accumulators")
        for p in params:
            like = (p.shape, p.type.dtype)
            tn = p.type.name
            staging.array(self.params.get(p.name), *like, f"parameter {p.name!r}", tn)
            if adamw:
                m, v = self.moments.get(p.name, (None, None))
                staging.array(m, *like, self.label("m", p.name), tn)
                staging.array(v, *like, self.label("v", p.name), tn)
            if self.accumulators is not None:
                staging.array(self.accumulators.get(p.name), *like, self.label("acc", p.name),
                              tn)
        if self.loss_acc is not None:
            staging.array(self.loss_acc, (1,), np.dtype(np.float32),
                          f"tensor {'ggopt.grad_acc.loss'!r} (loss accumulator)", "F32")
        return staging


@dataclasses.dataclass(frozen=True)
class StateView:
    """A read-only view of an optimization's state (tensors are the context's own).

    ``params`` are the parameters of the built graphs in graph order (empty before a dynamic
    context's first build); ``param_accs``, ``moments`` and ``loss_acc`` the persistent
    tensors (absent ones empty / None); ``persistent`` the object holding them (None once
    closed). ``pending``: a loaded state waits for the first build.
    """

    params: tuple[Tensor, ...]
    param_accs: Mapping[Tensor, Tensor]
    moments: Mapping[Tensor, tuple[Tensor, Tensor]]
    loss_acc: Tensor | None
    counters: Counters
    rng: Mt19937
    built: bool
    pending: bool
    persistent: Persistent | None


class OptState:
    """The mutable state of one optimization; owned and locked by its OptContext."""

    def __init__(self, rng: Mt19937) -> None:
        self.persist: Persistent | None = Persistent()  # None once closed
        self.counters = Counters()
        self.rng = rng
        self.pending: _Pending | None = None

    @property
    def built(self) -> bool:
        return self.persist is not None and self.persist.allocated

    def view(self, params: list[Tensor]) -> StateView:
        p = self.persist
        return StateView(
            params=tuple(params), param_accs=dict(p.param_accs) if p else {},
            moments=dict(p.moments) if p else {}, loss_acc=p.loss_acc if p else None,
            counters=self.counters, rng=self.rng, built=self.built,
            pending=self.pending is not None, persistent=p)

    def stage(self, spec: Spec, snap: Snapshot, params: list[Tensor],
              extras: Staging) -> Staging:
        """Check ``snap`` against ``params`` and stage its restoration with ``extras`` (the
        caller's checked changes: a shard order, a schedule position).

        ``params``: the built parameters; for a dynamic context before its first build, the
        prepared graph's (or none: not known yet). A built context restores everything at
        commit. An unbuilt one restores the generator and ``extras`` at commit (a loop
        shuffles before its first alloc), and, when ``params`` are known, the counters; the
        tensors (and the counters otherwise) wait for the first build, after
        :meth:`check_pending` verified the prepared graph.
        """
        snap.check_setup(spec)
        staging = Staging(snap.where)
        if params or self.built:
            snap.check_params(spec, params)
        if self.built:
            self._stage_tensors(staging, snap, params)
        staging.change(self._rng_change(snap))
        staging.extend(extras)
        if self.built or params:
            staging.change(self._counters_change(snap.counters))
        if self.built:
            staging.change(self._drop_pending)
            return staging
        undo_of_load: list[Callable[[], None]] = []
        staging.change(lambda: self._set_pending(_Pending(snap, not params, undo_of_load)))
        outer = Staging(snap.where)
        outer.change(lambda: undo_of_load.append(staging.commit()))
        return outer

    def check_pending(self, spec: Spec, prepared: list[Tensor]) -> None:
        """Verify a pending load against the prepared graph's parameters; a failed check
        undoes what the load restored (generator, shard order, schedule, counters), drops it
        and raises."""
        pending = self.pending
        if pending is None:
            return
        try:
            pending.snap.check_params(spec, prepared)
        except Exception:
            self.pending = None
            for undo in pending.undo:
                undo()
            raise

    def begin_pending(self) -> None:
        """At the first alloc, after :meth:`check_pending`: the counters, if they waited."""
        pending = self.pending
        if pending is not None and pending.counters_wait:
            self.counters = pending.snap.counters
            self.pending = _Pending(pending.snap, False, [])

    def finish_pending(self, params: list[Tensor]) -> None:
        """After the first build: fill the new parameters, accumulators and moments."""
        if self.pending is None:
            return
        staging = Staging(self.pending.snap.where)
        self._stage_tensors(staging, self.pending.snap, params)
        staging.change(self._drop_pending)
        staging.commit()

    # --- staging -------------------------------------------------------------------------------
    def _rng_change(self, snap: Snapshot) -> Callable[[], Callable[[], None]]:
        def apply() -> Callable[[], None]:
            old = copy.deepcopy(vars(self.rng))  # exactly as it was, not just equivalent
            self.rng.set_state(snap.rng)  # checked when the snapshot was made
            return lambda: vars(self.rng).update(old)

        return apply

    def _counters_change(self, counters: Counters) -> Callable[[], Callable[[], None]]:
        def apply() -> Callable[[], None]:
            old, self.counters = self.counters, counters

            def undo() -> None:
                self.counters = old

            return undo

        return apply

    def _stage_tensors(self, staging: Staging, snap: Snapshot, params: list[Tensor]) -> None:
        persist = self.persist
        assert persist is not None  # the context is open
        for p in params:
            staging.change(_setter(p, snap.params[p.name]))
            if p in persist.moments:
                m, v = persist.moments[p]
                sm, sv = snap.moments[p.name]
                assert sm is not None and sv is not None  # checked
                staging.change(_setter(m, sm))
                staging.change(_setter(v, sv))
            if p in persist.param_accs:
                acc = persist.param_accs[p]
                src = (np.zeros(acc.shape, np.float32) if snap.accumulators is None
                       else snap.accumulators[p.name])  # a boundary save without accumulators
                assert src is not None  # checked
                staging.change(_setter(acc, src))
        if persist.loss_acc is not None and snap.loss_acc is not None:
            staging.change(_setter(persist.loss_acc, snap.loss_acc))

    def _set_pending(self, pending: _Pending) -> None:
        self.pending = pending

    def _drop_pending(self) -> None:
        self.pending = None


def _setter(target: Tensor, array: np.ndarray) -> Callable[[], None]:
    def apply() -> None:
        tensor_set(target, array)

    return apply


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A load waiting for the first build: its tensors (and, with ``counters_wait``, its
    counters) still to apply; ``undo`` reverts what it applied already."""

    snap: Snapshot
    counters_wait: bool
    undo: list[Callable[[], None]]
