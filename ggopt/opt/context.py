"""The optimization context: builds the forward/backward/optimizer graphs and runs them.

A context picks one of three graphs per ``alloc``: ``gf`` (forward and loss), ``gb_grad``
(plus backward pass) or ``gb_opt`` (plus optimizer step, every ``opt_period``-th backward
call); ``eval`` computes it and records the result. Graphs are *static* when the compute
context, inputs and outputs are passed at construction (built once), *dynamic* otherwise
(rebuilt for every batch after :meth:`OptContext.prepare_alloc`).

Deliberate differences from ggml (spec §2.8):

- dynamic graphs re-zero the gradient accumulators at the start of each optimizer period
  (ggml never does, Q1);
- forward-only evals do not advance the accumulation counter (Q2);
- ``BuildType.GRAD`` computes gradients and never steps (ggml aborts, Q4): accumulators sum
  over ``opt_period`` backward evals and are zeroed when the next period starts;
- :meth:`OptContext.reset` and :meth:`OptContext.grad_acc` work on the persistent
  accumulators, also with dynamic graphs after an eval (ggml: no-op / crash, Q6).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import graph as _graph
from .. import ops
from ..backend import alloc_ctx_tensors, tensor_get, tensor_set
from ..context import Context
from ..errors import DTypeError, GgoptError, ShapeError, StateError
from ..tensor import Tensor
from ..types import F32, TensorFlag
from .checkpoint import Checkpointing
from .enums import BuildType, LossType, OptimizerType, optimizer_name
from .params import OptParams, optimizer_step_values
from .result import Result
from .rng import Mt19937
from .rollback import graph_rollback

if TYPE_CHECKING:
    from ..dist import Communicator
    from .checkpoint import PendingState

__all__ = ["OptContext"]


def _locked(method):
    """Run ``method`` holding the scheduler's lock, then the context's (always in this order)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._sched, self._lock:
            return method(self, *args, **kwargs)

    return wrapper


@dataclasses.dataclass
class _Build:
    """Everything one graph build produces, committed to the context only when complete."""

    gf: _graph.Graph
    labels: Tensor | None
    loss: Tensor
    pred: Tensor | None
    ncorrect: Tensor | None
    loss_per_datapoint: bool
    gb_grad: _graph.Graph | None = None
    gb_opt: _graph.Graph | None = None
    acc_by_node: dict[Tensor, Tensor] | None = None


class OptContext(Checkpointing):
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

    With ``params.comm`` a :class:`ggopt.dist.Communicator` of several ranks the context is
    data-parallel (``docs/distributed.md``): construction is collective, and an error on any
    rank raises on every rank.

    ggml: ``ggml_opt_init`` (and ``ggml_opt_free`` as :meth:`close`).
    """

    def __init__(self, params: OptParams) -> None:
        self._dp = None
        comm = params.comm if isinstance(params, OptParams) else None
        if comm is None:
            self._init(params)
            return
        from ..dist.data_parallel import DataParallel

        comm = DataParallel.check_comm(comm)
        if comm is None:  # a single rank is no communicator at all
            self._init(params)
            return
        comm.run_all("ggml_opt_init", lambda: self._init(params))
        self._dp = DataParallel(self, comm)
        if self._static_allocated:
            comm.run_all("ggml_opt_init", self._dp.setup)

    def _init(self, params: OptParams) -> None:
        fn = "ggml_opt_init"
        if not isinstance(params, OptParams):
            raise DTypeError(f"params must be an OptParams, got {type(params).__name__} ({fn})")
        sched = params.backend_sched
        for attr in ("backends", "reset", "alloc_graph", "graph_compute", "allocated_graph",
                     "__enter__"):
            if not hasattr(sched, attr):
                raise DTypeError(
                    f"backend_sched must be a ggopt.backend.Scheduler, got "
                    f"{type(sched).__name__} ({fn})"
                )
        loss_type = LossType.coerce(params.loss_type, fn)
        build_type = BuildType.coerce(params.build_type, fn)
        optimizer = OptimizerType.coerce(params.optimizer, fn)
        opt_period = params.opt_period
        if isinstance(opt_period, bool) or not isinstance(opt_period, (int, np.integer)):
            raise DTypeError(f"opt_period must be an int, got {opt_period!r} ({fn})")
        if opt_period < 1:
            raise ShapeError(f"opt_period must be >= 1, got {opt_period} ({fn})")
        if not callable(params.get_opt_pars):
            raise DTypeError(f"get_opt_pars must be callable ({fn})")
        given = [x is not None for x in (params.ctx_compute, params.inputs, params.outputs)]
        if any(given) and not all(given):
            raise StateError(
                "ctx_compute, inputs and outputs must all be set (static graphs) or all be "
                f"None (dynamic graphs, see prepare_alloc) ({fn})"
            )
        rng = Mt19937(params.rng_seed)

        self._sched = sched
        self._loss_type = loss_type
        self._build_type_alloc = build_type
        self._build_type = build_type
        self._optimizer = optimizer
        self._opt_period = int(opt_period)
        self._get_opt_pars: Callable[[Any], Any] = params.get_opt_pars
        self._get_opt_pars_ud = params.get_opt_pars_ud
        self._rng = rng
        self._static_graphs = all(given)
        self._closed = False
        self._lock = threading.RLock()
        self._alloc_thread: int | None = None  # the thread whose alloc waits for its eval
        self._eval_failed = False  # the pending alloc's eval was tried and raised

        self._ctx_compute: Context | None = params.ctx_compute
        self._inputs: Tensor | None = params.inputs
        self._outputs: Tensor | None = params.outputs
        self._labels: Tensor | None = None
        self._loss: Tensor | None = None
        self._pred: Tensor | None = None
        self._ncorrect: Tensor | None = None
        self._loss_per_datapoint = False
        self._gf: _graph.Graph | None = None
        self._gb_grad: _graph.Graph | None = None
        self._gb_opt: _graph.Graph | None = None
        self._allocated_graph: _graph.Graph | None = None
        self._acc_by_node: dict[Tensor, Tensor] | None = None

        # Persistent state, created by the first build that needs it.
        self._ctx_static = Context()
        self._static_allocated = False
        self._param_accs: dict[Tensor, Tensor] = {}
        self._loss_acc: Tensor | None = None
        self._moments: dict[Tensor, tuple[Tensor, Tensor]] = {}
        self._opt_step_params: Tensor | None = None

        self._eval_ready = False
        self._iter = 1
        self._opt_i = 0
        self._period_complete = False
        self._pending_state: PendingState | None = None  # loaded before the first dynamic build

        if self._static_graphs:
            self._check_static_args(params.ctx_compute, params.inputs, params.outputs, fn)
            gf = _graph.new_graph_custom(params.ctx_compute, _graph.GRAPH_DEFAULT_SIZE, True)
            with graph_rollback(gf, [params.ctx_compute], [params.inputs, params.outputs]):
                _graph.build_forward_expand(gf, params.outputs)
                self._commit(self._build(gf, self._build_type_alloc))

    # --- validation helpers ---------------------------------------------------------------
    def _check_open(self, fn: str) -> None:
        if self._closed:
            raise StateError(f"the optimization context is closed ({fn})")

    @staticmethod
    def _check_static_args(ctx_compute: object, inputs: object, outputs: object, fn: str):
        if not isinstance(ctx_compute, Context):
            raise DTypeError(
                f"ctx_compute must be a Context, got {type(ctx_compute).__name__} ({fn})"
            )
        for name, t in (("inputs", inputs), ("outputs", outputs)):
            if not isinstance(t, Tensor):
                raise DTypeError(f"{name} must be a Tensor, got {type(t).__name__} ({fn})")

    # --- graph construction ---------------------------------------------------------------
    def _build_loss(self, ctx: Context, outputs: Tensor) -> tuple:
        """Construct the loss (and for CE the prediction) tensors; flags are set later."""
        fn = "ggml_opt_build"
        labels = pred = ncorrect = None
        scale = float(np.float32(1.0) / np.float32(self._opt_period * outputs.nelements()))
        lt = self._loss_type
        if lt is LossType.MEAN:
            loss = ops.set_name(ops.sum(ctx, outputs), "loss_sum")
            loss = ops.set_name(ops.scale(ctx, loss, scale), "loss_mean")
        elif lt is LossType.SUM:
            loss = ops.set_name(ops.sum(ctx, outputs), "loss_sum")
        elif lt is LossType.CROSS_ENTROPY:
            if not outputs.is_matrix():
                raise ShapeError(
                    f"CROSS_ENTROPY needs matrix outputs [nclasses, ndata], got ne="
                    f"{list(outputs.ne)} ({fn})"
                )
            labels = ops.set_name(ctx.dup_tensor(outputs), "labels")
            loss = ops.set_name(ops.cross_entropy_loss(ctx, outputs, labels), "loss_cross_entropy")
            if self._opt_period > 1:
                loss = ops.scale(ctx, loss, float(np.float32(1.0) / np.float32(self._opt_period)))
                ops.set_name(loss, "loss_cross_entropy_scaled")
            pred = ops.set_name(ops.argmax(ctx, outputs), "pred")
            ncorrect = ops.count_equal(ctx, pred, ops.argmax(ctx, labels))
            ops.set_name(ncorrect, "ncorrect")
        else:
            labels = ops.set_name(ctx.dup_tensor(outputs), "labels")
            err = ops.set_name(ops.sub(ctx, outputs, labels), "loss_error")
            err = ops.set_name(ops.sqr(ctx, err), "loss_squared_error")
            loss = ops.set_name(ops.sum(ctx, err), "loss_sum_squared_error")
            loss = ops.set_name(ops.scale(ctx, loss, scale), "loss_mean_squared_error")
        return labels, loss, pred, ncorrect, lt is not LossType.SUM

    def _build(self, gf: _graph.Graph, build_type: BuildType) -> _Build:
        """Add loss (and backward and optimizer) parts to ``gf``; ggml: ``ggml_opt_build``.

        Validates first; the only state touched before the last check are the new tensors.
        """
        fn = "ggml_opt_build"
        ctx_compute, inputs, outputs = self._ctx_compute, self._inputs, self._outputs
        if self._static_graphs and inputs.buffer is None:
            raise StateError(
                f"inputs '{inputs.name}' must be allocated statically: allocate its context "
                f"(ggopt.backend.alloc_ctx_tensors) before creating the context ({fn})"
            )
        if any(node.flags & TensorFlag.LOSS for node in gf.nodes):
            raise StateError(f"support for extra loss terms not implemented: the forward graph "
                             f"already has a LOSS node ({fn})")
        need_grads = not self._static_allocated or build_type >= BuildType.GRAD
        need_grads = need_grads and self._build_type_alloc >= BuildType.GRAD
        accumulate = self._build_type_alloc >= BuildType.GRAD and not (
            self._static_graphs
            and self._build_type_alloc is BuildType.OPT
            and self._opt_period == 1
        )
        if need_grads and not any(node.flags & TensorFlag.PARAM for node in gf.nodes):
            raise ShapeError(
                f"the forward graph has no parameter; did you forget to call set_param? ({fn})"
            )
        if need_grads and self._static_allocated and accumulate:
            for node in gf.nodes:
                if node.flags & TensorFlag.PARAM and node not in self._param_accs:
                    raise ShapeError(
                        f"parameter '{node.name}' was not in the first graph; dynamic graphs "
                        f"must keep the parameters of the first build ({fn})"
                    )

        ctx_results = self._ctx_static if self._static_graphs else ctx_compute
        labels, loss, pred, ncorrect, per_datapoint = self._build_loss(ctx_results, outputs)
        ops.set_loss(loss)
        ops.set_input(inputs)
        ops.set_output(outputs)
        if labels is not None:
            ops.set_input(labels)
        ops.set_output(loss)
        _graph.build_forward_expand(gf, loss)
        for t in (pred, ncorrect):
            if t is not None:
                ops.set_output(t)
                _graph.build_forward_expand(gf, t)
        out = _Build(gf, labels, loss, pred, ncorrect, per_datapoint)
        if not need_grads:
            if not self._static_allocated:
                self._alloc_static()
            return out

        first = not self._static_allocated
        if first:
            param_accs, moments, loss_acc = self._new_persistent(gf, accumulate)
        else:
            param_accs, moments, loss_acc = self._param_accs, self._moments, self._loss_acc
        grad_accs = []
        for node in gf.nodes:
            if node.flags & TensorFlag.LOSS:
                grad_accs.append(loss_acc)
            elif node.flags & TensorFlag.PARAM:
                grad_accs.append(param_accs.get(node))
            else:
                grad_accs.append(None)
        out.gb_grad = _graph.graph_dup(ctx_compute, gf, True)
        _graph.build_backward_expand(ctx_compute, out.gb_grad, grad_accs)
        out.acc_by_node = {n: a for n, a in zip(gf.nodes, grad_accs, strict=True) if a is not None}
        if self._build_type_alloc is BuildType.OPT and (first or build_type is BuildType.OPT):
            out.gb_opt = self._build_opt(gf, out.gb_grad, moments)
        if first:
            self._param_accs, self._moments, self._loss_acc = param_accs, moments, loss_acc
            self._alloc_static()
            self._reset_grads(momenta=True)
        return out

    def _new_persistent(self, gf: _graph.Graph, accumulate: bool) -> tuple:
        """Create (without memory) the gradient accumulators and AdamW moments of the params."""
        param_accs: dict[Tensor, Tensor] = {}
        moments: dict[Tensor, tuple[Tensor, Tensor]] = {}
        need_moments = self._build_type_alloc is BuildType.OPT and (
            self._optimizer is OptimizerType.ADAMW
        )
        new = self._ctx_static.new_tensor
        params = [node for node in gf.nodes if node.flags & TensorFlag.PARAM]
        for node in params if accumulate else ():  # one block of memory (data-parallel sums it)
            param_accs[node] = ops.set_name(new(F32, node.ne), f"{node.name} (grad acc)")
        for node in params:
            if need_moments:
                moments[node] = (
                    ops.set_name(new(F32, node.ne), f"AdamW m for {node.name}"),
                    ops.set_name(new(F32, node.ne), f"AdamW v for {node.name}"),
                )
        loss_acc = ops.set_name(new(F32, (1,)), "loss (grad acc)")
        return param_accs, moments, loss_acc

    def _build_opt(self, gf: _graph.Graph, gb_grad: _graph.Graph, moments: dict) -> _graph.Graph:
        """``gb_grad`` plus one optimizer step per parameter, in reverse forward order."""
        ctx_compute = self._ctx_compute
        gb_opt = _graph.graph_dup(ctx_compute, gb_grad, True)
        if self._opt_step_params is None:
            self._alloc_opt_step_params()
        name = optimizer_name(self._optimizer)
        for node in reversed(gf.nodes):
            if not node.flags & TensorFlag.PARAM:
                continue
            grad = _graph.graph_get_grad(gb_opt, node)
            if grad is None:
                continue
            if self._optimizer is OptimizerType.ADAMW:
                m, v = moments[node]
                step = ops.opt_step_adamw(ctx_compute, node, grad, m, v, self._opt_step_params)
            else:
                step = ops.opt_step_sgd(ctx_compute, node, grad, self._opt_step_params)
            ops.set_name(step, f"{name} step for {node.name}")
            _graph.build_forward_expand(gb_opt, step)
        return gb_opt

    def _alloc_static(self) -> None:
        """Give the accumulators, moments (and static loss tensors) memory on backend 0."""
        if len(self._ctx_static) > 0:
            alloc_ctx_tensors(self._ctx_static, self._sched.backends[0])
        self._static_allocated = True

    def _alloc_opt_step_params(self) -> None:
        n = 7 if self._optimizer is OptimizerType.ADAMW else 2
        ctx_cpu = Context()
        t = ctx_cpu.new_tensor_1d(F32, n)
        ops.set_name(t, f"{optimizer_name(self._optimizer)}_params")
        ops.set_input(t)
        alloc_ctx_tensors(ctx_cpu, self._sched.backends[-1])
        self._opt_step_params = t

    def _commit(self, b: _Build) -> None:
        self._gf, self._gb_grad, self._gb_opt = b.gf, b.gb_grad, b.gb_opt
        self._labels, self._loss, self._pred, self._ncorrect = b.labels, b.loss, b.pred, b.ncorrect
        self._loss_per_datapoint = b.loss_per_datapoint
        if b.acc_by_node is not None:
            self._acc_by_node = b.acc_by_node

    def _reset_grads(self, momenta: bool) -> None:
        """Zero the accumulators (the loss's holds the seed 1) and optionally the moments."""
        for acc in self._param_accs.values():
            tensor_set(acc, np.zeros(acc.nelements(), dtype=np.float32))
        if self._loss_acc is not None:
            tensor_set(self._loss_acc, np.ones(1, dtype=np.float32))
        if momenta:
            for m, v in self._moments.values():
                tensor_set(m, np.zeros(m.nelements(), dtype=np.float32))
                tensor_set(v, np.zeros(v.nelements(), dtype=np.float32))

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
        if self._static_graphs:
            raise StateError(f"prepare_alloc is for dynamic graphs; this context is static ({fn})")
        if self._eval_ready:
            raise StateError(f"a graph is allocated and waiting for eval; call eval first ({fn})")
        self._check_static_args(ctx_compute, inputs, outputs, fn)
        if not isinstance(gf, _graph.Graph):
            raise DTypeError(f"gf must be a Graph, got {type(gf).__name__} ({fn})")
        self._ctx_compute, self._gf, self._inputs, self._outputs = ctx_compute, gf, inputs, outputs

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
        if backward and self._build_type_alloc is BuildType.FORWARD:
            raise StateError(
                f"this context was built with BuildType.FORWARD and has no backward pass ({fn})"
            )
        if not self._static_graphs and self._gf is None:
            raise StateError(
                f"dynamic graphs: call prepare_alloc with a new forward graph before alloc ({fn})"
            )
        if self._pending_state is not None:
            self._pending_state.begin(self)
        if not backward:
            build_type = BuildType.FORWARD
        elif self._build_type_alloc is BuildType.OPT and (self._opt_i + 1) % self._period == 0:
            build_type = BuildType.OPT
        else:
            build_type = BuildType.GRAD

        if not self._static_graphs:
            with graph_rollback(self._gf, [self._ctx_compute, self._ctx_static],
                                [self._inputs, self._outputs]):
                self._commit(self._build(self._gf, build_type))
            if self._pending_state is not None:
                self._pending_state.finish(self)
                self._pending_state = None
            if self._dp is not None and not self._dp.ready:
                self._dp.comm.run_all(fn, self._dp.setup)
        graph = {
            BuildType.FORWARD: self._gf,
            BuildType.GRAD: self._gb_grad,
            # data-parallel: the step runs in eval, after the accumulators are summed
            BuildType.OPT: self._gb_opt if self._dp is None else self._gb_grad,
        }[build_type]
        if graph is not self._allocated_graph or self._sched.allocated_graph is not graph:
            self._sched.reset()
            self._sched.alloc_graph(graph)
            self._allocated_graph = graph
        if self._period_complete and self._param_accs:
            self._reset_grads(momenta=False)
        self._period_complete = False
        self._build_type = build_type
        self._eval_ready = True
        self._alloc_thread = threading.get_ident()
        self._eval_failed = False

    def _abandon(self) -> None:
        """Drop an alloc that waits for its eval (after an interrupted eval); dynamic graphs
        also drop their graphs, which hold the loss now: prepare_alloc comes next."""
        self._eval_ready = False
        self._alloc_thread = None
        self._eval_failed = False
        if not self._static_graphs:
            self._gf = self._gb_grad = self._gb_opt = self._allocated_graph = None

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
        nd = self._outputs.ne[1]
        if result is not None:
            result._check_eval(self._loss_per_datapoint, self._opt_period, nd)
        graph = self._allocated_graph
        if self._sched.allocated_graph is not graph:
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
                values = optimizer_step_values(pars, self._optimizer, self._iter)
                tensor_set(self._opt_step_params, values)
            self._sched.graph_compute(graph)
        except GgoptError:  # refused before anything changed: fix the cause and eval again
            raise
        except BaseException:  # an interrupt or a failing callback: the alloc stands (eval may
            self._eval_failed = True  # be retried), and reset drops it
            raise

        if self._build_type is not BuildType.FORWARD:
            self._opt_i = (self._opt_i + 1) % self._period
            self._period_complete = self._opt_i == 0
            if self._dp is not None and self._period_complete:
                self._dp.end_period(step=is_opt)
        if is_opt:
            self._iter += 1
        if not self._static_graphs:
            self._gf = self._gb_grad = self._gb_opt = self._allocated_graph = None
        self._eval_ready = False
        self._alloc_thread = None
        self._eval_failed = False
        if result is None:
            return
        loss = np.float32(tensor_get(self._loss).reshape(-1)[0])
        pred = None if self._pred is None else tensor_get(self._pred)
        ncorrect = None
        if self._ncorrect is not None:
            ncorrect = int(tensor_get(self._ncorrect).reshape(-1)[0])
        result._add_eval(self._loss_per_datapoint, self._opt_period, nd, loss, pred, ncorrect)

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
        if self._static_allocated:
            self._reset_grads(momenta=bool(optimizer))
        if optimizer:
            self._iter = 1

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
            if self._build_type_alloc is BuildType.FORWARD:
                raise StateError(f"a FORWARD-only context has no gradients ({fn})")
            raise StateError(f"no gradient graph built yet; call alloc first ({fn})")
        return self._acc_by_node.get(node)

    @_locked
    def close(self) -> None:
        """Release the graphs and persistent tensors (ggml: ``ggml_opt_free``); idempotent."""
        self._closed = True
        self._gf = self._gb_grad = self._gb_opt = self._allocated_graph = None
        self._acc_by_node = None
        self._param_accs.clear()
        self._moments.clear()
        self._loss_acc = self._opt_step_params = None
        self._ctx_static = None
        self._pending_state = None

    def __enter__(self) -> OptContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- read-only properties -------------------------------------------------------------
    @property
    def inputs(self) -> Tensor | None:
        """Input tensor (ggml: ``ggml_opt_inputs``); dynamic graphs: valid until next alloc."""
        return self._inputs

    @property
    def outputs(self) -> Tensor | None:
        """Output tensor (ggml: ``ggml_opt_outputs``)."""
        return self._outputs

    @property
    def labels(self) -> Tensor | None:
        """Labels input; None for MEAN and SUM losses (ggml: ``ggml_opt_labels``)."""
        return self._labels

    @property
    def loss(self) -> Tensor | None:
        """Scalar loss tensor (ggml: ``ggml_opt_loss``)."""
        return self._loss

    @property
    def pred(self) -> Tensor | None:
        """Predicted classes, CROSS_ENTROPY only (ggml: ``ggml_opt_pred``)."""
        return self._pred

    @property
    def ncorrect(self) -> Tensor | None:
        """Number of correct predictions, CROSS_ENTROPY only (ggml: ``ggml_opt_ncorrect``)."""
        return self._ncorrect

    @property
    def static_graphs(self) -> bool:
        """True when the graphs were built once at construction (``ggml_opt_static_graphs``)."""
        return self._static_graphs

    @property
    def optimizer_type(self) -> OptimizerType:
        """The optimizer (ggml: ``ggml_opt_context_optimizer_type``)."""
        return self._optimizer

    @property
    def loss_type(self) -> LossType:
        return self._loss_type

    @property
    def build_type(self) -> BuildType:
        """Largest graph this context builds."""
        return self._build_type_alloc

    @property
    def opt_period(self) -> int:
        """Physical batches per optimizer step (over all ranks when data-parallel)."""
        return self._opt_period

    @property
    def _period(self) -> int:
        """Backward evals of this process per optimizer step."""
        return self._opt_period if self._dp is None else self._dp.local_period

    @property
    def comm(self) -> Communicator | None:
        """The :class:`ggopt.dist.Communicator` of a data-parallel context, else None (also
        for a communicator of one rank)."""
        return None if self._dp is None else self._dp.comm

    @property
    def rng(self) -> Mt19937:
        """The ``std::mt19937`` that :meth:`Dataset.shuffle` draws from."""
        return self._rng

    def __repr__(self) -> str:
        kind = "static" if self._static_graphs else "dynamic"
        return (
            f"OptContext({kind}, loss={self._loss_type.name}, build={self._build_type_alloc.name}, "
            f"optimizer={optimizer_name(self._optimizer)}, opt_period={self._opt_period})"
        )
