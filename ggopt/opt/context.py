"""The optimization context: ggml-opt's state machine over the graphs :mod:`.build` makes.

A context picks one of three graphs per ``alloc``: ``gf`` (forward and loss), ``gb_grad``
(plus backward pass) or ``gb_opt`` (plus optimizer step, every ``opt_period``-th backward
call); ``eval`` computes it and records the result. Graphs are *static* when the compute
context, inputs and outputs are passed at construction (built once), *dynamic* otherwise
(rebuilt for every batch after :meth:`OptContext.prepare_alloc`).

Deliberate differences from ggml (ggml-opt-spec §2.8):

- dynamic graphs re-zero the gradient accumulators at the start of each optimizer period
  (ggml never does, ggml-opt-spec Q1);
- forward-only evals do not advance the accumulation counter (ggml-opt-spec Q2);
- ``BuildType.GRAD`` computes gradients and never steps (ggml aborts, ggml-opt-spec Q4):
  accumulators sum over ``opt_period`` backward evals and are zeroed when the next period starts;
- :meth:`OptContext.reset` and :meth:`OptContext.grad_acc` work on the persistent
  accumulators, also with dynamic graphs after an eval (ggml: no-op / crash, ggml-opt-spec Q6).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from .. import graph as _graph
from ..backend import tensor_get, tensor_set
from ..context import Context
from ..errors import DTypeError, GgoptError, ShapeError, StateError
from ..graph import graph_rollback
from ..io.staging import Staging
from ..tensor import Tensor
from ..types import FLAG_PARAM
from .build import Spec, _Build, build, check_graph_args
from .checkpoint import Checkpointing
from .context_views import ContextViews
from .enums import BuildType, LossType, optimizer_name
from .params import OptParams, optimizer_step_values
from .result import Result
from .rng import Mt19937
from .schedule import Schedule
from .state import Counters, OptState, Snapshot, StateView

if TYPE_CHECKING:
    from ..distributed import Communicator
    from ..distributed.data_parallel import DataParallel

__all__ = ["OptContext"]

_M = TypeVar("_M", bound=Callable[..., Any])


def _locked(method: _M) -> _M:
    """Run ``method`` holding the scheduler's lock, then the context's (always in this order)."""

    @functools.wraps(method)
    def wrapper(self: OptContext, *args: Any, **kwargs: Any) -> Any:
        with self.locked():
            return method(self, *args, **kwargs)

    return cast(_M, wrapper)


class OptContext(Checkpointing, ContextViews):
    """State of an optimization: graphs, gradient accumulators, optimizer moments, counters.

    Parameters
    ----------
    params : OptParams
        From :func:`default_params`, with ``ctx_compute``, ``inputs`` and ``outputs`` set for
        static graphs. ``inputs`` must already have memory (allocate its context yourself);
        ``outputs.ne[1]`` is the number of datapoints per batch.

    Raises
    ------
    DTypeError, ShapeError, StateError
        Invalid parameters or an unusable graph; nothing is kept, and the graph and context
        passed in are left as they were.

    Threads: every call holds the scheduler's lock and the context's own, so calls from
    several threads never overlap. An alloc/eval pair belongs to the thread that called
    :meth:`alloc`: :meth:`eval` from another thread raises StateError. If another context (or
    thread) allocates its graph on the shared scheduler between :meth:`alloc` and :meth:`eval`,
    eval raises StateError and computes nothing; hold the scheduler (``with sched:``) around
    the pair, as :func:`~ggopt.opt.epoch` and :func:`~ggopt.opt.fit` do, to share one.

    With ``params.comm`` a :class:`ggopt.distributed.Communicator` of several ranks the context is
    data-parallel (``docs/distributed.md``): construction is collective, and an error on any
    rank raises on every rank.

    ggml: ``ggml_opt_init`` (and ``ggml_opt_free`` as :meth:`close`).
    """

    def __init__(self, params: OptParams) -> None:
        self._dp: DataParallel | None = None
        comm = params.comm if isinstance(params, OptParams) else None
        if comm is None:
            self._init(params)
            return
        from ..distributed.data_parallel import DataParallel

        comm = DataParallel.check_comm(comm)
        if comm is None:  # a single rank is no communicator at all
            self._init(params)
            return
        comm.run_all("ggml_opt_init", lambda: self._init(params))
        self._dp = DataParallel(self, comm)
        if self._st.built:
            comm.run_all("ggml_opt_init", self._dp.setup)

    def _init(self, params: OptParams) -> None:
        fn = "ggml_opt_init"
        if not isinstance(params, OptParams):
            raise DTypeError(f"params must be an OptParams, got {type(params).__name__} ({fn})")
        rng = Mt19937(params.rng_seed)
        self._spec = spec = Spec.of(params, fn)
        build_type = spec.build_type
        self._get_opt_pars: Callable[[Any], Any] = params.get_opt_pars
        self._get_opt_pars_ud = params.get_opt_pars_ud
        self._st = OptState(rng)  # accumulators, moments, counters, generator, pending load
        self._closed = False
        self._lock = threading.RLock()
        self._alloc_thread: int | None = None  # the thread whose alloc waits for its eval
        self._eval_failed = False  # the pending alloc's eval was tried and raised
        self._ctx_compute: Context | None = params.ctx_compute
        self._inputs: Tensor | None = params.inputs
        self._outputs: Tensor | None = params.outputs
        self._next_gf: _graph.Graph | None = None  # dynamic graphs: from prepare_alloc
        self._b: _Build | None = None  # the graphs and loss tensors of the last build
        self._acc_by_node: dict[Tensor, Tensor] | None = None

        # The state machine.
        self._build_type = build_type  # of the allocated graph
        self._allocated_graph: _graph.Graph | None = None
        self._eval_ready = False

        if self._spec.static_graphs:
            check_graph_args(params.ctx_compute, params.inputs, params.outputs, fn)
            assert params.ctx_compute is not None and params.outputs is not None  # just checked
            gf = _graph.new_graph_custom(params.ctx_compute, spec.graph_size, True)
            try:
                with graph_rollback(gf, [params.ctx_compute], [params.inputs, params.outputs]):
                    _graph.build_forward_expand(gf, params.outputs)
                    self._build(gf, build_type)
            except ShapeError as exc:
                if "graph of size" not in str(exc):  # not the compute context's memory
                    raise
                raise ShapeError(f"{fn}: the static graphs need more than OptParams.graph_size="
                                 f"{spec.graph_size} nodes ({exc})") from None

    # --- validation helpers ---------------------------------------------------------------
    def _check_open(self, fn: str) -> None:
        if self._closed:
            raise StateError(f"the optimization context is closed ({fn})")

    def _build(self, gf: _graph.Graph, build_type: BuildType) -> None:
        assert self._st.persist is not None and self._ctx_compute is not None
        assert self._inputs is not None and self._outputs is not None
        b = build(self._spec, self._st.persist, self._ctx_compute, gf, self._inputs, self._outputs,
                  build_type)
        self._b = b
        if b.acc_by_node is not None:
            self._acc_by_node = b.acc_by_node

    # --- the state machine ----------------------------------------------------------------
    @_locked
    def prepare_alloc(
        self, ctx_compute: Context, gf: _graph.Graph, inputs: Tensor, outputs: Tensor
    ) -> None:
        """Set the compute context, forward graph, inputs and outputs of the next alloc.

        Dynamic graphs only: call it with a fresh context and graph before every
        :meth:`alloc`. Tensors from the previous graph become invalid at that alloc.

        ggml: ``ggml_opt_prepare_alloc``.
        """
        fn = "ggml_opt_prepare_alloc"
        self._check_open(fn)
        if self._spec.static_graphs:
            raise StateError(f"prepare_alloc is for dynamic graphs; this context is static ({fn})")
        if self._eval_ready:
            raise StateError(f"a graph is allocated and waiting for eval; call eval first ({fn})")
        check_graph_args(ctx_compute, inputs, outputs, fn)
        if not isinstance(gf, _graph.Graph):
            raise DTypeError(f"gf must be a Graph, got {type(gf).__name__} ({fn})")
        self._st.check_pending(self._spec, self._graph_params(gf))
        self._ctx_compute, self._next_gf = ctx_compute, gf
        self._inputs, self._outputs = inputs, outputs

    @_locked
    def alloc(self, backward: bool) -> None:
        """Choose and allocate the graph of the next :meth:`eval`.

        ``backward=False`` picks the forward graph. ``backward=True`` picks the optimizer graph
        when this call completes an accumulation period (every ``opt_period``-th backward
        call), the gradient graph otherwise. Accumulators are zeroed first when the previous
        eval completed a period.

        Raises
        ------
        StateError
            Called twice without an eval, a backward pass on a FORWARD-only context, or (dynamic
            graphs) no :meth:`prepare_alloc` since the last eval.

        ggml: ``ggml_opt_alloc``.
        """
        fn = "ggml_opt_alloc"
        self._check_open(fn)
        if self._eval_ready:
            other = "" if self._alloc_thread == threading.get_ident() else (
                "; the pending alloc is another thread's")
            raise StateError(f"alloc called twice without eval in between{other} ({fn})")
        spec = self._spec
        if backward and spec.build_type is BuildType.FORWARD:
            raise StateError(
                f"this context was built with BuildType.FORWARD and has no backward pass ({fn})"
            )
        if not spec.static_graphs and self._next_gf is None:
            raise StateError(
                f"dynamic graphs: call prepare_alloc with a new forward graph before alloc ({fn})"
            )
        st = self._st
        if st.pending is not None:
            assert self._next_gf is not None  # pending loads are for unbuilt dynamic contexts
            st.check_pending(spec, self._graph_params(self._next_gf))
            st.begin_pending()
        if not backward:
            build_type = BuildType.FORWARD
        elif spec.build_type is BuildType.OPT and (st.counters.opt_i + 1) % self._period == 0:
            build_type = BuildType.OPT
        else:
            build_type = BuildType.GRAD

        if not spec.static_graphs:
            assert self._next_gf is not None and st.persist is not None
            with graph_rollback(self._next_gf, [self._ctx_compute, st.persist.ctx_static],
                                [self._inputs, self._outputs]):
                self._build(self._next_gf, build_type)
            st.finish_pending(self._built_params())
            if self._dp is not None and not self._dp.ready:
                self._dp.comm.run_all(fn, self._dp.setup)
        assert self._b is not None and st.persist is not None
        # data-parallel: the step runs in eval, after the accumulators are summed
        graph = self._b.graph(build_type if self._dp is None or build_type is not BuildType.OPT
                              else BuildType.GRAD)
        assert graph is not None  # built for every build type the context allows
        if graph is not self._allocated_graph or spec.sched.allocated_graph is not graph:
            spec.sched.reset()
            spec.sched.alloc_graph(graph)
            self._allocated_graph = graph
        if st.counters.period_complete and st.persist.param_accs:
            st.persist.reset_grads(momenta=False)
        st.counters = dataclasses.replace(st.counters, period_complete=False)
        self._build_type = build_type
        self._eval_ready = True
        self._alloc_thread = threading.get_ident()
        self._eval_failed = False

    def abandon(self) -> None:
        """Drop an alloc that waits for its eval (after an interrupted eval; no-op without
        one); dynamic graphs also drop their graphs, which hold the loss now: prepare_alloc
        comes next. The training loops call it when an epoch is cut short."""
        with self.locked():
            if self._eval_ready:
                self._abandon()

    def _abandon(self) -> None:
        self._eval_ready = False
        self._alloc_thread = None
        self._eval_failed = False
        if not self._spec.static_graphs:
            self._next_gf = self._allocated_graph = None

    @_locked
    def eval(self, result: Result | None = None) -> None:
        """Compute the allocated graph and add its loss (and predictions) to ``result``.

        On the optimizer graph, ``get_opt_pars(get_opt_pars_ud)`` is called first and its
        values checked; a bad value raises before any weight moves.

        ggml: ``ggml_opt_eval``.
        """
        fn = "ggml_opt_eval"
        self._check_open(fn)
        if not self._eval_ready:
            raise StateError(f"no graph allocated; call alloc before eval ({fn})")
        if self._alloc_thread != threading.get_ident():
            raise StateError(f"the pending alloc was made by another thread; an alloc/eval "
                             f"pair belongs to one thread ({fn})")
        if result is not None and not isinstance(result, Result):
            raise DTypeError(f"result must be a Result or None, got {type(result).__name__} ({fn})")
        spec, b, persist = self._spec, self._b, self._st.persist
        assert b is not None and persist is not None and self._outputs is not None
        nd = self._outputs.ne[1]
        if result is not None:
            result.check_eval(b.loss_per_datapoint, spec.opt_period, nd)
        graph = self._allocated_graph
        assert graph is not None
        if spec.sched.allocated_graph is not graph:
            self._abandon()
            raise StateError(
                f"the scheduler's graph was replaced since alloc (by another context or "
                f"thread); nothing was computed. Call alloc again (dynamic graphs: "
                f"prepare_alloc first), holding the scheduler (with sched: ...) around alloc "
                f"and eval ({fn})")
        is_opt = self._build_type is BuildType.OPT
        try:
            if is_opt:
                pars = self._get_opt_pars(self._get_opt_pars_ud)
                values = optimizer_step_values(pars, spec.optimizer, self._st.counters.iteration)
                tensor_set(persist.step_params(spec), values)
            spec.sched.graph_compute(graph)
        except GgoptError:  # refused before anything changed: fix the cause and eval again
            raise
        except BaseException:  # an interrupt or a failing callback: the alloc stands (eval may
            self._eval_failed = True  # be retried), and reset drops it
            raise

        c = self._st.counters
        if self._build_type is not BuildType.FORWARD:
            opt_i = (c.opt_i + 1) % self._period
            c = self._st.counters = Counters(c.iteration, opt_i, opt_i == 0)
            if self._dp is not None and c.period_complete:
                self._dp.end_period(step=is_opt)
        if is_opt:
            self._st.counters = dataclasses.replace(c, iteration=c.iteration + 1)
        if not spec.static_graphs:
            # the graphs go; the loss tensors stay readable until the next alloc
            self._next_gf = self._allocated_graph = None
        self._eval_ready = False
        self._alloc_thread = None
        self._eval_failed = False
        if result is None:
            return
        loss = np.float32(tensor_get(b.loss).reshape(-1)[0])
        pred = None if b.pred is None else tensor_get(b.pred)
        ncorrect = None
        if b.ncorrect is not None:
            ncorrect = int(tensor_get(b.ncorrect).reshape(-1)[0])
        result.add_eval(b.loss_per_datapoint, spec.opt_period, nd, loss, pred, ncorrect)

    @_locked
    def reset(self, optimizer: bool) -> None:
        """Zero the gradient accumulators; with ``optimizer=True`` also the AdamW moments and
        the step count used for bias correction. Parameters and the RNG are untouched.

        An alloc whose eval raised (a bad optimizer value, a KeyboardInterrupt, ...) is
        dropped, so :meth:`alloc` works again; an alloc whose eval has not been tried stays.

        ggml: ``ggml_opt_reset``.
        """
        self._check_open("ggml_opt_reset")
        if self._eval_ready and self._eval_failed:
            self._abandon()
        st = self._st
        if st.built:
            assert st.persist is not None
            st.persist.reset_grads(momenta=bool(optimizer))
        if optimizer:
            st.counters = dataclasses.replace(st.counters, iteration=1)

    @_locked
    def grad_acc(self, node: Tensor) -> Tensor | None:
        """The gradient accumulator of forward node ``node``, or None if it has none.

        Parameters have accumulators when ``opt_period > 1``, in GRAD contexts and with
        dynamic graphs; the loss always has one (holding 1). Readable until the next alloc
        that starts a new period.

        ggml: ``ggml_opt_grad_acc``.
        """
        fn = "ggml_opt_grad_acc"
        self._check_open(fn)
        if not isinstance(node, Tensor):
            raise DTypeError(f"node must be a Tensor, got {type(node).__name__} ({fn})")
        if self._acc_by_node is None:
            if self._spec.build_type is BuildType.FORWARD:
                raise StateError(f"a FORWARD-only context has no gradients ({fn})")
            raise StateError(f"no gradient graph built yet; call alloc first ({fn})")
        return self._acc_by_node.get(node)

    # --- the state, for checkpoints, data parallelism and training loops ----------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[OptContext]:
        """Hold the scheduler's lock, then the context's (as every call does), e.g. around
        an alloc/eval pair or a whole epoch; re-entrant."""
        with self._spec.sched, self._lock:
            yield self

    @_locked
    def state(self) -> StateView:
        """A read-only view of the optimization's state: parameters, accumulators, moments,
        counters, generator, whether a loaded state is pending (:mod:`ggopt.opt.state`)."""
        return self._st.view(self._built_params())

    @_locked
    def stage_load(self, snap: Snapshot, extras: Staging | None = None) -> Staging:
        """Check ``snap`` against this context and stage its restoration (nothing changes
        until the returned staging is committed); ``extras``: the caller's checked changes
        (a dataset's shard order, a schedule's position) to commit with it.

        A dynamic context before its first build checks ``snap`` against the graph given to
        :meth:`prepare_alloc` and restores the counters, generator and ``extras`` at commit,
        the tensors at the first build; without a prepared graph all of it waits for the
        first :meth:`alloc`, which drops it (changing nothing) when the graph does not match.
        """
        fn = "ggml_opt_load_state"
        self._check_open(fn)
        if self._eval_ready:
            raise StateError(f"a graph is allocated and waiting for eval; load between evals "
                             f"({fn})")
        st = self._st
        params = self._built_params() if st.built else (
            self._graph_params(self._next_gf) if self._next_gf is not None else [])
        return st.stage(self._spec, snap, params, extras or Staging(snap.where))

    def load(self, snap: Snapshot, extras: Staging | None = None) -> None:
        """Restore ``snap`` in one transaction: :meth:`stage_load`, then commit."""
        with self.locked():
            self.stage_load(snap, extras).commit()

    def _built_params(self) -> list[Tensor]:
        """The parameters of the built graphs, in graph order (none before a build)."""
        if self._spec.static_graphs and self._b is not None:
            return self._graph_params(self._b.gf)
        persist = self._st.persist
        return [] if persist is None else list(persist.param_accs)

    @staticmethod
    def _graph_params(gf: _graph.Graph) -> list[Tensor]:
        return [n for n in gf.nodes if n.flags & FLAG_PARAM]

    @property
    def spec(self) -> Spec:
        """What the context builds (scheduler, loss, build type, optimizer, opt_period)."""
        return self._spec

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def eval_pending(self) -> bool:
        """An alloc waits for its eval."""
        return self._eval_ready

    @property
    def schedule(self) -> Schedule | None:
        """``get_opt_pars`` when it is a :class:`~ggopt.opt.schedule.Schedule`."""
        return self._get_opt_pars if isinstance(self._get_opt_pars, Schedule) else None

    @property
    def loss_per_datapoint(self) -> bool:
        """Whether the loss is a mean over datapoints (every loss but SUM)."""
        return self._spec.loss_type is not LossType.SUM

    @_locked
    def close(self) -> None:
        """Release the graphs and persistent tensors (ggml: ``ggml_opt_free``); idempotent."""
        self._closed = True
        self._next_gf = self._allocated_graph = None
        self._acc_by_node = None
        self._st.persist = None
        self._st.pending = None

    def __enter__(self) -> OptContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- read-only properties (the graph tensors: ContextViews) -------------------------
    @property
    def _period(self) -> int:
        """Backward evals of this process per optimizer step."""
        return self._spec.opt_period if self._dp is None else self._dp.local_period

    @property
    def comm(self) -> Communicator | None:
        """The :class:`ggopt.distributed.Communicator` of a data-parallel context, else None (also
        for a communicator of one rank)."""
        return None if self._dp is None else self._dp.comm

    @property
    def rng(self) -> Mt19937:
        """The ``std::mt19937`` that :meth:`Dataset.shuffle` draws from."""
        return self._st.rng

    def __repr__(self) -> str:
        spec = self._spec
        kind = "static" if spec.static_graphs else "dynamic"
        return (
            f"OptContext({kind}, loss={spec.loss_type.name}, build={spec.build_type.name}, "
            f"optimizer={optimizer_name(spec.optimizer)}, opt_period={spec.opt_period})"
        )
