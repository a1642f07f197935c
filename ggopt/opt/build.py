"""Graph building for the optimization context (ggml: ``ggml_opt_build``).

:func:`build` adds the loss (and the backward pass and the optimizer steps) to a forward graph
and returns one :class:`_Build`; the :class:`Persistent` tensors (gradient accumulators,
AdamW moments, optimizer-step parameters) are created by the first build that needs them and
shared by every later one. The state machine that picks and runs the graphs is
:class:`ggopt.opt.OptContext`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import graph as _graph
from .. import ops
from ..backend import Scheduler, alloc_ctx_tensors, tensor_fill, tensor_set
from ..context import Context
from ..errors import DTypeError, InvalidValueError, ShapeError, StateError
from ..tensor import Tensor
from ..types import F32, FLAG_LOSS, FLAG_PARAM
from .checks import check_float32
from .enums import BuildType, LossType, OptimizerType, optimizer_name
from .params import OptParams

__all__ = ["Spec", "Persistent", "build", "check_graph_args", "optimizer_steps", "clip_grads"]


@dataclasses.dataclass(frozen=True)
class Spec:
    """What an optimization context builds: fixed at ``ggml_opt_init``."""

    sched: Scheduler
    loss_type: LossType
    build_type: BuildType  # the largest graph the context builds
    optimizer: OptimizerType
    opt_period: int
    static_graphs: bool
    graph_size: int  # of the static forward graph
    grad_clip: float | None = None  # the largest global gradient norm (None: no clipping)

    @classmethod
    def of(cls, params: OptParams, fn: str) -> Spec:
        """The checked spec of ``params`` (raises DTypeError, InvalidValueError, StateError)."""
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
            raise InvalidValueError(f"opt_period must be >= 1, got {opt_period} ({fn})")
        if not callable(params.get_opt_pars):
            raise DTypeError(f"get_opt_pars must be callable ({fn})")
        graph_size = params.graph_size
        if isinstance(graph_size, bool) or not isinstance(graph_size, (int, np.integer)):
            raise DTypeError(f"graph_size must be an int, got {graph_size!r} ({fn})")
        if graph_size < 1:
            raise InvalidValueError(f"graph_size must be >= 1, got {graph_size} ({fn})")
        given = [x is not None for x in (params.ctx_compute, params.inputs, params.outputs)]
        if any(given) and not all(given):
            raise StateError(
                "ctx_compute, inputs and outputs must all be set (static graphs) or all be "
                f"None (dynamic graphs, see prepare_alloc) ({fn})"
            )
        grad_clip = None if params.grad_clip is None else check_float32(
            params.grad_clip, "grad_clip", fn, low=0.0, low_open=True)
        return cls(sched, loss_type, build_type, optimizer, int(opt_period), all(given),
                   int(graph_size), grad_clip)


def check_graph_args(ctx_compute: object, inputs: object, outputs: object, fn: str) -> None:
    """Raise unless a compute context and two tensors are given (static or prepared graphs)."""
    if not isinstance(ctx_compute, Context):
        raise DTypeError(f"ctx_compute must be a Context, got {type(ctx_compute).__name__} ({fn})")
    for name, t in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(t, Tensor):
            raise DTypeError(f"{name} must be a Tensor, got {type(t).__name__} ({fn})")


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

    def graph(self, build_type: BuildType) -> _graph.Graph | None:
        """The graph computing up to ``build_type``."""
        return {BuildType.FORWARD: self.gf, BuildType.GRAD: self.gb_grad,
                BuildType.OPT: self.gb_opt}[build_type]


class Persistent:
    """Tensors that outlive every graph: accumulators, moments, step parameters (and, for
    static graphs, the loss tensors), with memory on the scheduler's backends."""

    def __init__(self) -> None:
        self.ctx_static = Context()
        self.allocated = False
        self.param_accs: dict[Tensor, Tensor] = {}
        self.loss_acc: Tensor | None = None
        self.moments: dict[Tensor, tuple[Tensor, Tensor]] = {}
        self.opt_step_params: Tensor | None = None
        self.clip_consts: Tensor | None = None

    def alloc(self, sched: Scheduler) -> None:
        """Give the accumulators, moments (and static loss tensors) memory on backend 0."""
        if len(self.ctx_static) > 0:
            alloc_ctx_tensors(self.ctx_static, sched.backends[0])
        self.allocated = True

    def reset_grads(self, momenta: bool) -> None:
        """Zero the accumulators (the loss's holds the seed 1) and optionally the moments."""
        for acc in self.param_accs.values():
            tensor_fill(acc, 0.0)
        if self.loss_acc is not None:
            tensor_fill(self.loss_acc, 1.0)
        if momenta:
            for m, v in self.moments.values():
                tensor_fill(m, 0.0)
                tensor_fill(v, 0.0)

    def step_params(self, spec: Spec) -> Tensor:
        """The host tensor of the optimizer's per-step values, made on first use."""
        if self.opt_step_params is None:
            n = 7 if spec.optimizer is OptimizerType.ADAMW else 2
            ctx_cpu = Context()
            t = ctx_cpu.new_tensor_1d(F32, n)
            ops.set_name(t, f"{optimizer_name(spec.optimizer)}_params")
            ops.set_input(t)
            alloc_ctx_tensors(ctx_cpu, spec.sched.backends[-1])
            self.opt_step_params = t
        return self.opt_step_params

    def clip_constants(self, spec: Spec) -> Tensor:
        """The host tensor ``[grad_clip, 1e-6, 1]`` gradient clipping reads, made on first
        use."""
        if self.clip_consts is None:
            assert spec.grad_clip is not None  # only clipping contexts ask
            ctx_cpu = Context()
            t = ops.set_name(ctx_cpu.new_tensor_1d(F32, 3), "grad_clip constants")
            ops.set_input(t)
            alloc_ctx_tensors(ctx_cpu, spec.sched.backends[-1])
            tensor_set(t, np.array([spec.grad_clip, 1e-6, 1.0], np.float32))
            self.clip_consts = t
        return self.clip_consts

    def create(self, spec: Spec, gf: _graph.Graph, accumulate: bool) -> tuple[
            dict[Tensor, Tensor], dict[Tensor, tuple[Tensor, Tensor]], Tensor]:
        """New (memory-less, uncommitted) accumulators, AdamW moments and loss accumulator."""
        param_accs: dict[Tensor, Tensor] = {}
        moments: dict[Tensor, tuple[Tensor, Tensor]] = {}
        need_moments = spec.build_type is BuildType.OPT and (
            spec.optimizer is OptimizerType.ADAMW
        )
        new = self.ctx_static.new_tensor
        params = [node for node in gf.nodes if node.flags & FLAG_PARAM]
        for node in params if accumulate else ():  # one block of memory (data-parallel sums it)
            param_accs[node] = ops.set_name(new(F32, node.ne), f"{node.name} (grad acc)")
        for node in params:
            if need_moments:
                moments[node] = (
                    ops.set_name(new(F32, node.ne), f"AdamW m for {node.name}"),
                    ops.set_name(new(F32, node.ne), f"AdamW v for {node.name}"),
                )
        return param_accs, moments, ops.set_name(new(F32, (1,)), "loss (grad acc)")


def _build_loss(spec: Spec, ctx: Context, outputs: Tensor) -> tuple[
        Tensor | None, Tensor, Tensor | None, Tensor | None, bool]:
    """Construct the loss (and for CE the prediction) tensors; flags are set later."""
    fn = "ggml_opt_build"
    labels = pred = ncorrect = None
    scale = float(np.float32(1.0) / np.float32(spec.opt_period * outputs.nelements()))
    lt = spec.loss_type
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
        if spec.opt_period > 1:
            loss = ops.scale(ctx, loss, float(np.float32(1.0) / np.float32(spec.opt_period)))
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


def build(spec: Spec, persist: Persistent, ctx_compute: Context, gf: _graph.Graph,
          inputs: Tensor, outputs: Tensor, build_type: BuildType) -> _Build:
    """Add loss (and backward and optimizer) parts to ``gf``; ggml: ``ggml_opt_build``.

    Validates first; the only state touched before the last check are the new tensors.
    """
    fn = "ggml_opt_build"
    if spec.static_graphs and inputs.buffer is None:
        raise StateError(
            f"inputs '{inputs.name}' must be allocated statically: allocate its context "
            f"(ggopt.backend.alloc_ctx_tensors) before creating the context ({fn})"
        )
    if any(node.flags & FLAG_LOSS for node in gf.nodes):
        raise StateError(f"support for extra loss terms not implemented: the forward graph "
                         f"already has a LOSS node ({fn})")
    need_grads = not persist.allocated or build_type >= BuildType.GRAD
    need_grads = need_grads and spec.build_type >= BuildType.GRAD
    accumulate = spec.build_type >= BuildType.GRAD and not (
        spec.static_graphs and spec.build_type is BuildType.OPT and spec.opt_period == 1
    )
    if need_grads and not any(node.flags & FLAG_PARAM for node in gf.nodes):
        raise ShapeError(
            f"the forward graph has no parameter; did you forget to call set_param? ({fn})"
        )
    if need_grads and persist.allocated and accumulate:
        for node in gf.nodes:
            if node.flags & FLAG_PARAM and node not in persist.param_accs:
                raise ShapeError(
                    f"parameter '{node.name}' was not in the first graph; dynamic graphs "
                    f"must keep the parameters of the first build ({fn})"
                )

    ctx_results = persist.ctx_static if spec.static_graphs else ctx_compute
    labels, loss, pred, ncorrect, per_datapoint = _build_loss(spec, ctx_results, outputs)
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
        if not persist.allocated:
            persist.alloc(spec.sched)
        return out

    first = not persist.allocated
    if first:
        param_accs, moments, loss_acc = persist.create(spec, gf, accumulate)
    else:
        param_accs, moments = persist.param_accs, persist.moments
        assert persist.loss_acc is not None  # made with the accumulators
        loss_acc = persist.loss_acc
    grad_accs: list[Tensor | None] = []
    for node in gf.nodes:
        if node.flags & FLAG_LOSS:
            grad_accs.append(loss_acc)
        elif node.flags & FLAG_PARAM:
            grad_accs.append(param_accs.get(node))
        else:
            grad_accs.append(None)
    out.gb_grad = _graph.graph_dup(ctx_compute, gf, True)
    _graph.build_backward_expand(ctx_compute, out.gb_grad, grad_accs)
    out.acc_by_node = {n: a for n, a in zip(gf.nodes, grad_accs, strict=True) if a is not None}
    if spec.build_type is BuildType.OPT and (first or build_type is BuildType.OPT):
        out.gb_opt = _build_opt(spec, persist, moments, ctx_compute, gf, out.gb_grad)
    if first:
        persist.param_accs, persist.moments, persist.loss_acc = param_accs, moments, loss_acc
        persist.alloc(spec.sched)
        persist.reset_grads(momenta=True)
    return out


def _build_opt(spec: Spec, persist: Persistent, moments: dict[Tensor, tuple[Tensor, Tensor]],
               ctx_compute: Context, gf: _graph.Graph, gb_grad: _graph.Graph) -> _graph.Graph:
    """``gb_grad`` plus one optimizer step per parameter, in reverse forward order."""
    gb_opt = _graph.graph_dup(ctx_compute, gb_grad, True)
    grads = [(node, grad) for node in reversed(gf.nodes) if node.flags & FLAG_PARAM
             if (grad := _graph.graph_get_grad(gb_opt, node)) is not None]
    optimizer_steps(spec, persist, moments, ctx_compute, gb_opt, grads)
    return gb_opt


def optimizer_steps(spec: Spec, persist: Persistent,
                    moments: dict[Tensor, tuple[Tensor, Tensor]], ctx: Context,
                    graph: _graph.Graph, grads: list[tuple[Tensor, Tensor]]) -> None:
    """Add the optimizer step of each ``(parameter, gradient)`` to ``graph``, in that order.

    With ``spec.grad_clip`` the gradients are first clipped (:func:`clip_grads`).
    The one builder of optimizer steps: :func:`build`'s ``gb_opt`` (gradients from the
    backward pass) and the data-parallel step graph (gradients: the summed accumulators).
    """
    step_params = persist.step_params(spec)
    name = optimizer_name(spec.optimizer)
    if spec.grad_clip is not None and grads:
        grads = clip_grads(ctx, graph, grads, persist.clip_constants(spec))
    for node, grad in grads:
        if spec.optimizer is OptimizerType.ADAMW:
            m, v = moments[node]
            step = ops.opt_step_adamw(ctx, node, grad, m, v, step_params)
        else:
            step = ops.opt_step_sgd(ctx, node, grad, step_params)
        ops.set_name(step, f"{name} step for {node.name}")
        _graph.build_forward_expand(graph, step)


def clip_grads(ctx: Context, graph: _graph.Graph, grads: list[tuple[Tensor, Tensor]],
               consts: Tensor) -> list[tuple[Tensor, Tensor]]:
    """The gradients scaled as PyTorch's ``clip_grad_norm_`` scales them, in graph ops.

    ``norm = sqrt(sum of every gradient's sum(sqr))`` (each sum accumulated in double),
    ``c = max / (norm + 1e-6)`` and the factor ``min(c, 1)``, exact in float32 as ``c*s +
    (1 - s)`` with ``s = step(norm + 1e-6 - max)`` (1 when clipping, else 0: a factor of
    exactly 1). ``consts``: ``[max, 1e-6, 1]``. The factor node is named "grad_clip factor".
    """
    total: Tensor | None = None
    for _, grad in grads:
        part = ops.sum(ctx, ops.sqr(ctx, grad))
        total = part if total is None else ops.add(ctx, total, part)
    assert total is not None  # grads is not empty
    norm = ops.set_name(ops.sqrt(ctx, total), "grad_clip norm")
    max_norm, eps, one = (ops.view_1d(ctx, consts, 1, 4 * i) for i in range(3))
    denom = ops.add(ctx, norm, eps)
    clipping = ops.step(ctx, ops.sub(ctx, denom, max_norm))
    factor = ops.add(ctx, ops.mul(ctx, ops.div(ctx, max_norm, denom), clipping),
                     ops.sub(ctx, one, clipping))
    ops.set_name(factor, "grad_clip factor")
    _graph.build_forward_expand(graph, factor)
    return [(node, ops.mul(ctx, grad, factor)) for node, grad in grads]
