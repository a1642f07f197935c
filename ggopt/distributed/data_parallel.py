"""The data-parallel part of an :class:`~ggopt.opt.OptContext` whose ``OptParams.comm`` has
more than one rank.

``opt_period`` keeps its single-process meaning: physical batches per optimizer step, now
counted over all ranks. Each rank evaluates ``opt_period / size`` of them per step; every loss
is scaled by ``1/opt_period`` as in one process, so the sum of the ranks' accumulators is the
gradient one process accumulates. The context's state machine counts the local micro-batches;
when a rank completes its share, :meth:`DataParallel.end_period` sums the accumulators over
the ranks (one in-place all-reduce of the contiguous memory that holds them all) and runs a
graph of the optimizer steps alone, which reads the summed accumulators.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from .. import graph as _graph
from ..backend import Scheduler, tensor_get, tensor_set
from ..backend.buffer import Buffer, align, buffer_of
from ..context import Context
from ..errors import DTypeError, ShapeError, StateError
from ..opt.build import optimizer_steps
from ..opt.enums import BuildType
from ..tensor import Tensor
from .comm import Communicator

if TYPE_CHECKING:
    from ..opt.context import OptContext

__all__ = ["DataParallel"]

_FN = "ggml_opt_init (data-parallel)"


class DataParallel:
    """Keeps the ranks of one optimization in step; created by :class:`OptContext`."""

    def __init__(self, opt_ctx: OptContext, comm: Communicator) -> None:
        self._ctx = opt_ctx
        self.comm = comm
        self.local_period = 1  # set by setup()
        self.ready = False
        self._step_graph: _graph.Graph | None = None
        self._step_sched: Scheduler | None = None
        self._span: tuple[Buffer, int, int, list[Tensor]] | None = None
        self._steps = 0

    @staticmethod
    def check_comm(comm: object) -> Communicator | None:
        """``comm`` as a communicator worth using: None for None or a single rank."""
        if comm is None:
            return None
        if not isinstance(comm, Communicator):
            raise DTypeError(
                f"OptParams.comm must be a ggopt.distributed.Communicator or None, got "
                f"{type(comm).__name__} (ggml_opt_init)"
            )
        return comm if comm.size > 1 else None

    # --- set-up, once the context's persistent tensors exist ----------------------------------
    def setup(self) -> None:
        """Collective: agree on the model, broadcast rank 0's parameters, prepare the step.

        Raises the same :class:`ShapeError` on every rank when the ranks' models, losses,
        optimizers, batch sizes or ``opt_period`` differ, or ``opt_period`` is not a multiple
        of the number of ranks.
        """
        c = self._ctx
        spec, state = c.spec, c.state()
        assert state.built and c.inputs is not None and c.outputs is not None  # after a build
        params = state.params
        self.comm.agree(_FN, "the optimization", {
            "parameters (name, type, ne)": [(p.name, p.type.name, tuple(p.ne)) for p in params],
            "inputs ne": tuple(c.inputs.ne),
            "outputs ne": tuple(c.outputs.ne),
            "loss_type": spec.loss_type.name,
            "build_type": spec.build_type.name,
            "optimizer": spec.optimizer.name,
            "opt_period": spec.opt_period,
            "static_graphs": spec.static_graphs,
            "grad_clip": spec.grad_clip,
        })
        size = self.comm.size
        if spec.build_type >= BuildType.GRAD:
            if spec.opt_period % size != 0:
                raise ShapeError(
                    f"opt_period={spec.opt_period} (physical batches per optimizer step, over "
                    f"all ranks) must be a multiple of the {size} ranks ({_FN})"
                )
            self.local_period = spec.opt_period // size
        for p in params:
            self._bcast_tensor(p)
        if state.param_accs:
            self._span = self._accumulator_span(list(state.param_accs.values()))
        if spec.build_type is BuildType.OPT:
            self._build_step_graph()
        self.ready = True

    def _bcast_tensor(self, t: Tensor) -> None:
        if t.is_host and t.is_contiguous():
            self.comm.bcast_(t.numpy().reshape(-1))
            return
        arr = np.ascontiguousarray(tensor_get(t))
        self.comm.bcast_(arr)
        tensor_set(t, arr)

    @staticmethod
    def _accumulator_span(accs: list[Tensor]) -> tuple[Buffer, int, int, list[Tensor]]:
        """(buffer, first byte, end byte, accumulators by offset) of the one block holding
        every accumulator."""
        accs = sorted(accs, key=lambda a: a.offset)
        buf = buffer_of(accs[0])
        for prev, nxt in zip(accs, accs[1:]):
            if nxt.buffer is not buf or nxt.offset > align(prev.offset + prev.nbytes()):
                raise StateError(
                    "the gradient accumulators are not one contiguous block of memory; the "
                    f"all-reduce needs them to be ({_FN})"
                )
        start, end = accs[0].offset, accs[-1].offset + accs[-1].nbytes()
        if buf.is_host:  # zero the alignment gaps once: summed over ranks they stay zero
            for prev, nxt in zip(accs, accs[1:]):
                buf.data[prev.offset + prev.nbytes():nxt.offset] = 0
        return buf, start, end, accs

    def _build_step_graph(self) -> None:
        """The optimizer steps alone, reading the (summed) accumulators as gradients."""
        c = self._ctx
        state = c.state()
        assert state.persistent is not None  # the context is open
        ctx = Context()
        # room for the steps and for gradient clipping's 4 nodes per parameter
        size = max(_graph.GRAPH_DEFAULT_SIZE, 8 * len(state.param_accs) + 16)
        g = _graph.new_graph_custom(ctx, size, False)
        optimizer_steps(c.spec, state.persistent, dict(state.moments), ctx, g,
                        list(reversed(list(state.param_accs.items()))))
        self._step_graph = g
        self._step_sched = Scheduler(c.spec.sched.backends)
        self._step_sched.alloc_graph(g)

    # --- every period -------------------------------------------------------------------------
    def end_period(self, step: bool) -> None:
        """Sum the accumulators over the ranks; with ``step`` also take the optimizer step."""
        self._allreduce_accumulators()
        if not step:
            return
        assert self._step_sched is not None and self._step_graph is not None  # OPT contexts
        self._step_sched.graph_compute(self._step_graph)
        self._steps += 1
        every = self.comm.check_every
        if every and self._steps % every == 0:
            self.check_consistency()

    def _allreduce_accumulators(self) -> None:
        assert self._span is not None  # contexts with gradients have accumulators
        buf, start, end, accs = self._span
        if buf.is_host:
            self.comm.allreduce_sum_(buf.data[start:end].view(np.float32))
            return
        # Device memory: stage through one host array (CUDA-aware MPI is not assumed).
        host = np.concatenate([tensor_get(a).reshape(-1) for a in accs])
        self.comm.allreduce_sum_(host)
        at = 0
        for a in accs:
            n = a.nelements()
            tensor_set(a, host[at:at + n])
            at += n

    def check_consistency(self) -> None:
        """Collective: raise :class:`StateError` on every rank unless all ranks hold the same
        parameters, optimizer moments and step count (compared by a digest)."""
        state = self._ctx.state()
        iteration = state.counters.iteration
        h = hashlib.blake2b(digest_size=16)
        h.update(str(iteration).encode())
        for param in state.param_accs:
            h.update(np.ascontiguousarray(tensor_get(param)).tobytes())
            for moment in state.moments.get(param, ()):
                h.update(np.ascontiguousarray(tensor_get(moment)).tobytes())
        digests = self.comm.allgather(h.hexdigest())
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise StateError(
                f"ranks {differ} hold parameters or optimizer state different from rank 0's "
                f"after optimizer step {iteration} (data-parallel consistency check)"
            )
