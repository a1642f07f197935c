"""The scheduler: assigns graph nodes to backends, plans their memory and runs them
(ggml_backend_sched).

A graph is compiled once into *splits* (runs of consecutive nodes on one backend, each a list
of zero-argument steps) plus a memory plan per backend; the compiled form is cached per graph
and reused as long as the graph and the memory of its fixed tensors did not change, so
switching between a few static graphs costs a dictionary lookup and a pointer update per tensor.
A new graph with the structure of one compiled before (dynamic graphs: a fresh graph per
micro-batch) takes that graph's plan, found by its structural signature (:mod:`.plan_cache`),
when every step of the plan reads and writes only memory (no tensor object).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

from ..context import Context
from ..errors import DTypeError, InvalidValueError, ShapeError, StateError
from ..graph import Graph
from ..tensor import VIEW_OPS, WRITTEN_SOURCES, Op, Tensor
from ..types import FLAG_INPUT
from .alloc import plan_memory
from .base import Backend, Placement, Step
from .buffer import Buffer, buffer_of, init_view
from .fusion import count_uses
from .plan_cache import PlanCache, graph_signature
from .recompute import plan_recompute

__all__ = ["Scheduler"]

class _Split:
    __slots__ = ("backend", "nodes", "copies", "steps")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.nodes: list[Tensor] = []
        self.copies: list[tuple[Tensor, Tensor]] = []  # (source elsewhere, copy here)
        self.steps: list[Step] = []


class _Compiled:
    """A graph compiled for this scheduler's backends and buffers."""

    __slots__ = ("version", "placed", "views", "fixed", "splits", "sizes", "buffers", "steps",
                 "layout", "recomputed")

    def __init__(self) -> None:
        self.version = -1
        self.placed: list[tuple[Tensor, Backend, int]] = []   # tensors given memory
        self.views: list[Tensor] = []                         # views to point at their source
        self.fixed: list[tuple[Tensor, Buffer, int]] = []     # tensors that had memory already
        self.splits: list[_Split] = []
        self.sizes: dict[Backend, int] = {}
        self.buffers: dict[Backend, Buffer] = {}
        self.steps: list[Step] = []
        #: the placements of the scheduler's own copies of recomputed nodes (``recompute.py``),
        #: in ``placed`` too; a graph that takes this plan places the same copies
        self.recomputed: list[tuple[Tensor, Backend, int]] = []
        #: placed, views and fixed with positions in ``leafs + nodes`` for tensors (plans
        #: shared by signature; fixed holds the buffers the signature names by id)
        self.layout: tuple[list[tuple[int, Backend, int]], list[int],
                           list[tuple[int, Buffer, int]]] | None = None

    def share(self, g: Graph) -> bool:
        """Record the layout of ``g``'s plan so that other graphs can take it; False when the
        plan cannot serve another graph (a step bound to a tensor object)."""
        if any(s.copies or not s.backend.steps_bind_memory for s in self.splits):
            return False
        pos = {t: i for i, t in enumerate(g.leafs + g.nodes)}
        own = {t for t, _, _ in self.recomputed}
        placed = [(pos.get(t, -1), b, off) for t, b, off in self.placed if t not in own]
        views = [pos.get(t, -1) for t in self.views]
        fixed = [(pos.get(t, -1), buf, off) for t, buf, off in self.fixed]
        if any(i < 0 for i, _, _ in placed + fixed) or any(i < 0 for i in views):
            return False
        self.layout = placed, views, fixed
        return True

    def rebind(self, g: Graph) -> _Compiled:
        """This plan for ``g``, a graph of the same signature: the same steps and memory, with
        ``g``'s tensors in the places of the original graph's."""
        assert self.layout is not None
        placed, views, fixed = self.layout
        tensors = g.leafs + g.nodes
        out = _Compiled()
        out.version = g.version
        out.placed = [(tensors[i], b, off) for i, b, off in placed]
        out.recomputed = self.recomputed
        out.placed += self.recomputed
        out.views = [tensors[i] for i in views]
        out.fixed = [(tensors[i], buf, off) for i, buf, off in fixed]
        out.splits, out.sizes, out.buffers = self.splits, self.sizes, self.buffers
        out.steps, out.layout = self.steps, self.layout
        return out


class Scheduler:
    """Runs graphs over a priority list of backends (ggml_backend_sched).

    ``backends[0]`` has the highest priority; the last backend must be a host (CPU) backend,
    which computes whatever the others do not support.

    Threads: every call holds the scheduler's lock (a re-entrant lock), so calls from several
    threads never run inside one scheduler at the same time. A sequence of calls is not atomic
    by itself: hold the same lock around it with ``with sched:`` (for example reset, alloc,
    compute and reading the outputs). Without it, another thread may allocate its own graph in
    between; then :meth:`graph_compute` of yours raises StateError (it never computes the other
    graph), and so does reading a compute tensor of a graph that is no longer allocated.

    ``plan_cache``: how many compiled plans to keep by graph signature for new graphs of a
    known structure (0: compile every new graph).
    """

    def __init__(self, backends: Sequence[Backend], plan_cache: int = 8) -> None:
        backends = list(backends)
        if not backends:
            raise ShapeError("ggml_backend_sched_new: at least one backend is needed")
        for b in backends:
            if not isinstance(b, Backend):
                raise DTypeError(f"ggml_backend_sched_new: expected Backend objects, got "
                                 f"{type(b).__name__}")
        if len(set(map(id, backends))) != len(backends):
            raise ShapeError("ggml_backend_sched_new: a backend is listed twice")
        if not backends[-1].is_host:
            raise ShapeError("ggml_backend_sched_new: the last backend must be the CPU backend")
        if isinstance(plan_cache, bool) or not isinstance(plan_cache, int):
            raise DTypeError(f"ggml_backend_sched_new: plan_cache must be an int, got "
                             f"{plan_cache!r}")
        if plan_cache < 0:
            raise InvalidValueError(f"ggml_backend_sched_new: plan_cache must be >= 0, got "
                                    f"{plan_cache}")
        self.backends = backends
        self._members = set(backends)
        self._buffers: dict[Backend, Buffer] = {}
        self._cache: weakref.WeakKeyDictionary[Graph, _Compiled] = weakref.WeakKeyDictionary()
        self._plans: PlanCache[_Compiled] = PlanCache(plan_cache)  # by graph signature
        self._current: _Compiled | None = None
        self._graph: Graph | None = None  # the graph self._current was compiled from
        self._ctx = Context()  # holds split-input copies
        self._lock = threading.RLock()

    def __enter__(self) -> Scheduler:
        """Hold the scheduler's lock for a sequence of calls (``with sched: ...``)."""
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    # --- public API ---------------------------------------------------------------------------
    @property
    def n_backends(self) -> int:
        return len(self.backends)

    @property
    def allocated_graph(self) -> Graph | None:
        """The graph allocated by :meth:`alloc_graph` (None after :meth:`reset`)."""
        return self._graph

    def get_backend(self, i: int) -> Backend:
        """Backend ``i`` in priority order (ggml_backend_sched_get_backend)."""
        return self.backends[i]

    def reset(self) -> None:
        """Forget the allocated graph; its compute tensors lose their memory.

        ggml: ``ggml_backend_sched_reset``.
        """
        with self._lock:
            cur = self._current
            if cur is not None:
                for t, _, _ in cur.placed:
                    t.buffer = None
                for t in cur.views:
                    t.buffer = None
            self._current = None
            self._graph = None

    def release_buffers(self) -> None:
        """Forget the allocated graph (as :meth:`reset`) and every compiled plan, and drop the
        compute buffers: their memory goes back to the system once nothing else holds it (after
        a training run, before its results are written). The next :meth:`alloc_graph`
        allocates and plans again. ggml frees them only with the scheduler
        (``ggml_backend_sched_free``)."""
        with self._lock:
            self.reset()
            self._buffers.clear()
            self._cache.clear()
            self._plans.clear()

    def alloc_graph(self, g: Graph) -> bool:
        """Assign backends and memory to every tensor of ``g`` that has none.

        ggml: ``ggml_backend_sched_alloc_graph``.
        """
        if not isinstance(g, Graph):
            raise DTypeError(f"ggml_backend_sched_alloc_graph: expected a Graph, got "
                             f"{type(g).__name__}")
        with self._lock:
            return self._alloc_graph(g)

    def _alloc_graph(self, g: Graph) -> bool:
        if self._current is not None:
            raise StateError("ggml_backend_sched_alloc_graph: a graph is already allocated; call "
                             "reset() first")
        comp = self._cache.get(g)
        if comp is None or not self._still_valid(g, comp):
            comp = self._plan(g)
            self._cache[g] = comp
        for t, backend, off in comp.placed:
            t.buffer = comp.buffers[backend]
            t.offset = off
        for t in comp.views:
            init_view(t)
        self._current = comp
        self._graph = g
        return True

    def graph_compute(self, g: Graph) -> None:
        """Run ``g``, allocating it first if no graph is allocated.

        Raises StateError when another graph is allocated (ggml would silently compute that
        one) or ``g`` changed since it was allocated; nothing is computed then.

        ggml: ``ggml_backend_sched_graph_compute``.
        """
        if not isinstance(g, Graph):
            raise DTypeError(f"ggml_backend_sched_graph_compute: expected a Graph, got "
                             f"{type(g).__name__}")
        with self._lock:
            if self._current is None:
                self._alloc_graph(g)
            elif self._graph is not g:
                raise StateError(
                    "ggml_backend_sched_graph_compute: another graph is allocated (by "
                    "alloc_graph, maybe from another thread); call reset() and alloc_graph(g) "
                    "first, or hold the scheduler (with sched: ...) around alloc and compute")
            elif self._current.version != g.version:
                raise StateError(
                    "ggml_backend_sched_graph_compute: the graph changed since alloc_graph; "
                    "call reset() and alloc_graph(g) again")
            self._compute()

    def _compute(self, first: int = 0) -> None:
        """Run the steps inside the compute scopes of backends ``first`` and on.

        Plain nested ``with`` statements, not an ExitStack: once a scope's ``__enter__``
        returns, its ``__exit__`` runs whatever interrupts the compute (an ExitStack's Python
        code can be interrupted between entering a scope and registering its exit).
        """
        assert self._current is not None
        if first < len(self.backends):
            with self.backends[first].compute_scope():
                self._compute(first + 1)
            return
        for step in self._current.steps:
            step()
        for b in self.backends:
            b.synchronize()

    def get_n_splits(self) -> int:
        """Number of backend runs in the allocated graph (ggml_backend_sched_get_n_splits)."""
        return len(self._current.splits) if self._current else 0

    def get_n_copies(self) -> int:
        """Tensor copies between backends per compute (ggml_backend_sched_get_n_copies)."""
        return sum(len(s.copies) for s in self._current.splits) if self._current else 0

    def get_buffer_size(self, backend: Backend) -> int:
        """Bytes of compute memory planned on ``backend`` for the allocated graph."""
        return self._current.sizes.get(backend, 0) if self._current else 0

    def held_buffer_bytes(self) -> int:
        """Bytes of compute memory this scheduler holds on all its backends (each backend's
        buffer is as large as the largest graph planned on it so far)."""
        return sum(buf.size for buf in self._buffers.values())

    def get_tensor_backend(self, t: Tensor) -> Backend | None:
        """The backend whose memory holds ``t``, or None."""
        return self._memory_backend(t)

    # --- compilation --------------------------------------------------------------------------
    def _plan(self, g: Graph) -> _Compiled:
        """``g`` compiled, or the plan of an earlier graph of the same signature."""
        key = graph_signature(g) if self._plans.size > 0 else None
        if key is not None:
            shared = self._plans.get(key)
            if shared is not None and all(self._buffers.get(b) is buf
                                          for b, buf in shared.buffers.items()):
                return shared.rebind(g)
        comp = self._compile(g)
        if key is not None and comp.share(g):
            self._plans.put(key, comp)
        return comp

    def _still_valid(self, g: Graph, comp: _Compiled) -> bool:
        if comp.version != g.version:
            return False
        for b, buf in comp.buffers.items():
            if self._buffers.get(b) is not buf:
                return False
        for t, _, _ in comp.placed:
            if t.buffer is not None:
                return False
        for t, buf, off in comp.fixed:
            if t.buffer is not buf or t.offset != off:
                return False
        return True

    def _memory_backend(self, t: Tensor) -> Backend | None:
        """The scheduler's backend whose kernels read ``t``'s memory (ggml picks the backend
        by buffer type: host memory of any CPU backend, e.g. a mapped file, belongs to the
        scheduler's CPU backend); None when ``t`` has no memory. StateError when none of the
        scheduler's backends can read it."""
        owner = t.data_owner()
        if owner.buffer is None:
            return None
        buf = buffer_of(owner)
        if buf.backend in self._members:
            return buf.backend
        b = next((x for x in self.backends if x.can_read(buf)), None)
        if b is None:
            raise StateError(
                f"ggml_backend_sched_alloc_graph: '{owner.name}' lives on {buf.backend.name}, "
                f"which none of the scheduler's backends "
                f"({', '.join(x.name for x in self.backends)}) can read; allocate it on one of "
                "them")
        return b

    def _assign(self, g: Graph) -> dict[Tensor, Backend]:
        cpu = self.backends[-1]
        where: dict[Tensor, Backend] = {}
        for t in g.leafs:
            b = self._memory_backend(t)
            if b is None and t.flags & FLAG_INPUT:
                b = cpu
            if b is not None:
                where[t] = b
        for node in g.nodes:
            b = self._memory_backend(node)
            if b is None and node.view_src is not None:
                b = where.get(node.view_src)
            if b is None and node.flags & FLAG_INPUT and node.op is Op.NONE:
                b = cpu
            if b is None:
                b = next((x for x in self.backends if x.supports_op(node)), cpu)
            where[node] = b
            for s in node.src:
                if s is not None and s not in where:  # leafs without memory follow their consumer
                    where[s] = b
        return where

    def _compile(self, g: Graph) -> _Compiled:
        _check_no_writes_to_read_only(g)
        comp = _Compiled()
        comp.version = g.version
        where = self._assign(g)
        # One backend: cheap activations read again far later are recomputed there instead
        # of held (recompute.py); the readers of a copy take their sources from ``reads``.
        redo = plan_recompute(g.nodes, g.leafs, self._ctx) if len(self.backends) == 1 else None
        nodes, reads = (redo.nodes, redo.sources) if redo is not None else (g.nodes, {})
        for c in redo.copies if redo is not None else ():
            where[c] = self.backends[0]

        # Splits: runs of computing nodes on one backend, with copies of foreign inputs.
        splits: list[_Split] = []
        srcs_of: dict[Tensor, tuple[Tensor, ...]] = {}
        keep: dict[Backend, set[Tensor]] = {b: set() for b in self.backends}
        copies: dict[Backend, list[Tensor]] = {b: [] for b in self.backends}
        for node in nodes:
            if node.op in VIEW_OPS:
                continue
            b = where[node]
            if not splits or splits[-1].backend is not b:
                splits.append(_Split(b))
            split = splits[-1]
            split.nodes.append(node)
            srcs = []
            for j, s in enumerate(reads.get(node, node.src)):
                if s is None:
                    srcs.append(s)
                    continue
                home = where.get(s.data_owner(), where.get(s))
                if home is None or home is b or (home.is_host and b.is_host):
                    srcs.append(s)
                    continue
                if j in WRITTEN_SOURCES.get(node.op, ()):  # must live on the node's backend
                    raise StateError(
                        f"ggml_backend_sched_alloc_graph: {node.op.name} '{node.name}' runs on "
                        f"{b.name} but updates '{s.name}' in place, which lives on {home.name}; "
                        f"allocate the parameters on the scheduler's first backend ({home.name})")
                cp = next((c for src, c in split.copies if src is s), None)
                if cp is None:
                    cp = self._ctx.new_tensor(s.type, s.ne)
                    cp.name = f"{s.name}#{b.name}"
                    split.copies.append((s, cp))
                    copies[b].append(cp)
                    keep[home].add(s.data_owner())
                srcs.append(cp)
            srcs_of[node] = tuple(srcs)
        self._ctx.tensors.clear()  # the scheduler keeps the copies alive through its splits

        # Memory: one plan and one buffer per backend.
        fixed: dict[Tensor, tuple[Buffer, int]] = {}
        for t in list(g.leafs) + g.nodes:
            if t.buffer is not None:
                fixed[t] = (buffer_of(t), t.offset)
        for b in self.backends:
            nodes_b = [n for n in nodes if where.get(n) is b]
            leafs_b = [t for t in g.leafs if where.get(t) is b]
            def owns(t: Tensor, b: Backend = b) -> bool:
                return t.buffer is None and where.get(t, b) is b

            plan = plan_memory(nodes_b, leafs_b, copies[b], owns=owns, keep=keep[b],
                               sources=reads)
            comp.sizes[b] = plan.size
            buf = self._buffers.get(b)
            if plan.offsets and (buf is None or buf.size < plan.size):
                buf = b.alloc_buffer(plan.size)
                buf.lock = self._lock
                self._buffers[b] = buf
                self._cache.clear()  # every cached plan pointed into the old buffer
                self._plans.clear()
            if buf is not None:
                comp.buffers[b] = buf
            for t, off in plan.offsets.items():
                comp.placed.append((t, b, off))
        if redo is not None:
            made = set(redo.copies)
            comp.recomputed = [p for p in comp.placed if p[0] in made]
        comp.fixed = [(t, buf, off) for t, (buf, off) in fixed.items()]

        # The placement map: the steps bind their arrays through it; alloc_graph applies it.
        mem = Placement({t: (comp.buffers[b], off) for t, b, off in comp.placed})
        for t in list(g.leafs) + g.nodes:
            if t.view_src is not None and t not in fixed:
                comp.views.append(t)
                if not mem.has_memory(t.view_src):
                    raise StateError(f"ggml_backend_sched_alloc_graph: '{t.name}' views "
                                     f"'{t.view_src.name}', which has no memory")
        uses = count_uses(nodes)
        for split in splits:
            for src, cp in split.copies:
                split.steps.append(split.backend.copy_step(src, cp, mem))
            split.steps += split.backend.compile_nodes(split.nodes, srcs_of, mem, uses)
            comp.steps.extend(split.steps)
        comp.splits = splits
        return comp


def _check_no_writes_to_read_only(g: Graph) -> None:
    """StateError when a node would write read-only memory (a mapped file's bytes): a cpy
    into such a tensor, an optimizer step of a mapped parameter, any result placed there."""
    for node in g.nodes:
        if node.op in VIEW_OPS:
            continue
        written = [node.data_owner()] + [node.src[j] for j in WRITTEN_SOURCES.get(node.op, ())
                                         if node.src[j] is not None]
        for t in written:
            owner = t.data_owner()
            if owner.buffer is not None and buffer_of(owner).read_only:
                raise StateError(
                    f"ggml_backend_sched_alloc_graph: {node.op.name} '{node.name}' would write "
                    f"'{owner.name}', which lives in read-only memory (a mapped file's bytes); "
                    "copy it into a tensor of its own first")
