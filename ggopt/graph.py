"""Computation graphs and reverse-mode autodiff (ggml_cgraph and its builders).

All walks are iterative, so graph depth is limited by memory, not by Python's recursion limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

from .context import Context
from .errors import DTypeError, ShapeError, StateError
from .ops._base import BACKWARD, ignored_sources
from .ops.elementwise import _sub_inplace, add, add_inplace, neg, sub
from .ops.reduce import repeat_back
from .tensor import Op, Tensor
from .types import BF16, F16, F32, FLAG_COMPUTE, FLAG_INPUT, FLAG_LOSS, FLAG_PARAM, I32

__all__ = [
    "Graph",
    "GRAPH_DEFAULT_SIZE",
    "new_graph",
    "new_graph_custom",
    "build_forward_expand",
    "graph_dup",
    "build_backward_expand",
    "graph_rollback",
    "graph_reset",
    "graph_get_grad",
    "graph_get_grad_acc",
]

GRAPH_DEFAULT_SIZE = 2048

#: Ops that may produce a gradient-carrying result although they are views of another tensor.
_VIEW_LIKE_WITH_GRADS = frozenset({Op.CPY, Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})


class Graph:
    """An ordered list of nodes (ops and parameters) and leafs (constants, inputs).

    ``grads``/``grad_accs`` are dicts from forward tensor to gradient tensor, or None when the
    graph was created without gradient slots. ggml: ``struct ggml_cgraph``.
    """

    __slots__ = (
        "size", "nodes", "leafs", "visited", "grads", "grad_accs", "version", "__weakref__",
    )

    def __init__(self, size: int, grads: bool) -> None:
        self.size = size
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.visited: set[Tensor] = set()
        self.grads: dict[Tensor, Tensor] | None = {} if grads else None
        self.grad_accs: dict[Tensor, Tensor] | None = {} if grads else None
        #: bumped on every change, so a scheduler can tell whether its plan still fits
        self.version = 0

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def node(self, i: int) -> Tensor:
        """Node ``i``; negative indices count from the end (ggml_graph_node)."""
        return self.nodes[i]

    def __repr__(self) -> str:
        return f"Graph(n_nodes={self.n_nodes}, n_leafs={self.n_leafs}, size={self.size})"


def _check_graph(fn: str, g: object) -> Graph:
    if not isinstance(g, Graph):
        raise DTypeError(f"{fn}: expected a ggopt Graph, got {type(g).__name__}")
    return g


def new_graph(ctx: Context) -> Graph:
    """An empty graph of the default size without gradient slots (ggml_new_graph)."""
    return new_graph_custom(ctx, GRAPH_DEFAULT_SIZE, False)


def new_graph_custom(ctx: Context, size: int = GRAPH_DEFAULT_SIZE, grads: bool = False) -> Graph:
    """An empty graph holding up to ``size`` nodes; ``grads`` adds gradient slots."""
    if not isinstance(ctx, Context):
        raise DTypeError(f"ggml_new_graph_custom: ctx must be a Context, got {type(ctx).__name__}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ShapeError(f"ggml_new_graph_custom: size must be a positive int, got {size!r}")
    return Graph(size, bool(grads))


def build_forward_expand(g: Graph, tensor: Tensor) -> None:
    """Add ``tensor`` and its ancestors not yet in ``g``, sources first (ggml_build_forward_expand).

    Sources are visited in order src[0], src[1], ...; op-less non-parameter tensors become
    leafs, everything else nodes (flagged COMPUTE). Raises ShapeError, leaving ``g`` unchanged,
    when the nodes would not fit.
    """
    _check_graph("ggml_build_forward_expand", g)
    if not isinstance(tensor, Tensor):
        raise DTypeError(f"ggml_build_forward_expand: expected a Tensor, got "
                         f"{type(tensor).__name__}")
    _expand(g, tensor)


def _expand(g: Graph, tensor: Tensor) -> None:
    """:func:`build_forward_expand` of checked arguments."""
    visited = g.visited
    if tensor in visited:
        return
    new_nodes: list[Tensor] = []
    new_leafs: list[Tensor] = []
    seen = {tensor}
    stack = [(tensor, iter(tensor.src))]
    while stack:
        node, srcs = stack[-1]
        for s in srcs:
            if s is not None and s not in visited and s not in seen:
                seen.add(s)
                stack.append((s, iter(s.src)))
                break
        else:
            stack.pop()
            if node.op is Op.NONE and not node.flags & FLAG_PARAM:
                new_leafs.append(node)
            else:
                new_nodes.append(node)
    if len(g.nodes) + len(new_nodes) > g.size:
        raise ShapeError(f"ggml_build_forward_expand: graph of size {g.size} is full "
                         f"({len(g.nodes)} nodes + {len(new_nodes)} new); use new_graph_custom "
                         "with a larger size")
    for t in new_leafs:
        if not t.name:
            t.name = f"leaf_{len(g.leafs)}"
        g.leafs.append(t)
    for t in new_nodes:
        if not t.name:
            t.name = f"node_{len(g.nodes)}"
        t.flags |= FLAG_COMPUTE
        g.nodes.append(t)
    visited |= seen
    g.version += 1


def graph_dup(ctx: Context, g: Graph, force_grads: bool = False) -> Graph:
    """A copy of ``g`` sharing its tensors (ggml_graph_dup); ``force_grads`` adds gradient slots."""
    _check_graph("ggml_graph_dup", g)
    out = Graph(g.size, g.grads is not None or bool(force_grads))
    out.nodes = list(g.nodes)
    out.leafs = list(g.leafs)
    out.visited = set(g.visited)
    if g.grads is not None and g.grad_accs is not None:
        out.grads = dict(g.grads)
        out.grad_accs = dict(g.grad_accs)
    return out


def _slots(g: Graph) -> tuple[dict[Tensor, Tensor], dict[Tensor, Tensor]]:
    """``(grads, grad_accs)`` of a graph that has gradient slots."""
    if g.grads is None or g.grad_accs is None:
        raise StateError("the graph has no gradient slots")
    return g.grads, g.grad_accs


class _Sink:
    """Collects gradient contributions for the sources of one node (ggml_add_or_set & co)."""

    __slots__ = ("ctx", "g", "grads", "grad_accs", "node", "needs_grad", "ignored")

    def __init__(self, ctx: Context, g: Graph, needs_grad: set[Tensor]) -> None:
        self.ctx = ctx
        self.g = g
        self.grads, self.grad_accs = _slots(g)
        self.needs_grad = needs_grad
        self.node: Tensor | None = None  # the node whose backward rule runs
        self.ignored: frozenset[int] = frozenset()

    def _src(self, isrc: int) -> Tensor:
        assert self.node is not None
        return self.node.src[isrc]

    def needs(self, isrc: int) -> bool:
        return isrc not in self.ignored and self._src(isrc) in self.needs_grad

    def _set(self, src: Tensor, grad: Tensor) -> None:
        self.grads[src] = grad
        _expand(self.g, grad)

    def add(self, isrc: int, t: Tensor) -> None:
        src = self._src(isrc)
        prev = self.grads.get(src)
        if prev is None:
            self._set(src, t)
        elif src in self.grad_accs:
            self._set(src, add_inplace(self.ctx, prev, t))
        else:
            self._set(src, add(self.ctx, prev, t))

    def untile(self, isrc: int, t: Tensor) -> Tensor:
        src = self._src(isrc)
        return t if t.ne == src.ne else repeat_back(self.ctx, t, src)

    def sub(self, isrc: int, t: Tensor) -> None:
        src = self._src(isrc)
        prev = self.grads.get(src)
        if prev is None:
            self._set(src, neg(self.ctx, t))
        elif src in self.grad_accs:
            self._set(src, _sub_inplace(self.ctx, prev, t))
        else:
            self._set(src, sub(self.ctx, prev, t))


@contextlib.contextmanager
def graph_rollback(g: Graph, contexts: Iterable[Context | None],
                   tensors: Iterable[Tensor | None]) -> Iterator[None]:
    """Restore ``g``, the tensor lists of ``contexts`` and the flags and names of their tensors,
    of ``g``'s tensors and of ``tensors`` and their ancestors, if the block raises."""
    ctxs = [c for c in contexts if c is not None]
    saved_graph = (list(g.nodes), list(g.leafs), set(g.visited), g.version,
                   None if g.grads is None else dict(g.grads),
                   None if g.grad_accs is None else dict(g.grad_accs))
    saved_ctxs = [(c, len(c.tensors), c._mem_used) for c in ctxs]
    marked: dict[Tensor, tuple[int, str]] = {}
    stack = [t for t in tensors if t is not None]
    for t in [*g.nodes, *g.leafs, *(t for c in ctxs for t in c.tensors)]:
        marked[t] = (t.flags, t.name)
    seen = set(stack)
    while stack:  # the given tensors and everything they are computed from or view
        t = stack.pop()
        marked.setdefault(t, (t.flags, t.name))
        for s in (*t.src, t.view_src):
            if s is not None and s not in seen:
                seen.add(s)
                stack.append(s)
    try:
        yield
    except BaseException:
        g.nodes, g.leafs, g.visited, g.version, g.grads, g.grad_accs = saved_graph
        for c, n, used in saved_ctxs:
            del c.tensors[n:]
            c._mem_used = used
        for t, (flags, name) in marked.items():
            t.flags, t.name = flags, name
        raise


def build_backward_expand(
    ctx: Context, g: Graph, grad_accs: Sequence[Tensor | None] | None = None
) -> None:
    """Append the backward pass of ``g`` to ``g`` (ggml_build_backward_expand).

    Parameters
    ----------
    ctx:
        Context for the new gradient tensors.
    g:
        A forward graph with gradient slots, containing at least one PARAM and one LOSS node.
    grad_accs:
        Optional list indexed like ``g.nodes``: a persistent accumulator per forward node (or
        None). A node with an accumulator sums its gradient into it in place on every eval.
    """
    _check_graph("ggml_build_backward_expand", g)
    if not isinstance(ctx, Context):
        raise DTypeError(f"ggml_build_backward_expand: ctx must be a Context, got "
                         f"{type(ctx).__name__}")
    n_fwd = len(g.nodes)
    if n_fwd == 0:
        raise ShapeError("ggml_build_backward_expand: the graph has no nodes")
    if g.grads is None:
        raise StateError("ggml_build_backward_expand: the graph has no gradient slots; create it "
                         "with new_graph_custom(ctx, size, grads=True) or graph_dup(..., True)")
    if not any(n.flags & FLAG_PARAM for n in g.nodes):
        raise ShapeError("ggml_build_backward_expand: no parameter in the graph; did you forget "
                         "to call set_param?")
    if not any(n.flags & FLAG_LOSS for n in g.nodes):
        raise ShapeError("ggml_build_backward_expand: no loss in the graph; did you forget to "
                         "call set_loss?")
    if grad_accs is not None and len(grad_accs) < n_fwd:
        raise ShapeError(f"ggml_build_backward_expand: grad_accs has {len(grad_accs)} entries, "
                         f"the graph {n_fwd} nodes")

    # Decide which nodes need gradients and check everything before changing the graph.
    needs_grad: set[Tensor] = set()
    for node in g.nodes:
        if node.type is I32:
            continue
        need = bool(node.flags & (FLAG_PARAM | FLAG_LOSS))
        ignored = ignored_sources(node)
        for j, s in enumerate(node.src):
            if s is None or j in ignored or s not in needs_grad:
                continue
            if s.type not in (F32, F16, BF16):
                raise DTypeError(f"ggml_build_backward_expand: '{s.name}' needs a gradient but is "
                                 f"{s.type.name}; only F32/F16/BF16 tensors can")
            need = True
        if not need:
            continue
        if node.view_src is not None and node.op not in _VIEW_LIKE_WITH_GRADS and \
                not (node.op is Op.NONE and node.flags & FLAG_PARAM):
            raise ShapeError(f"ggml_build_backward_expand: '{node.name}' ({node.op.name}) is an "
                             "in-place result and cannot carry a gradient")
        if node.op not in BACKWARD and node.op is not Op.NONE:
            raise ShapeError(f"ggml_build_backward_expand: op {node.op.name} of '{node.name}' has "
                             "no backward rule")
        needs_grad.add(node)

    with graph_rollback(g, [ctx], []):  # a backward rule refused: graph and context as they were
        _propagate(ctx, g, grad_accs, needs_grad, n_fwd)
    g.version += 1


def _propagate(ctx: Context, g: Graph, grad_accs: Sequence[Tensor | None] | None,
               needs_grad: set[Tensor], n_fwd: int) -> None:
    grads, accs = _slots(g)
    grads.clear()
    accs.clear()
    for i, node in enumerate(g.nodes[:n_fwd]):
        if node not in needs_grad:
            continue
        acc = grad_accs[i] if grad_accs is not None else None
        if acc is None and node.flags & FLAG_LOSS:
            acc = ctx.new_tensor(F32, node.ne)
            acc.name = f"{node.name} (grad acc)"
            acc.flags |= FLAG_INPUT  # holds the seed 1.0: placed first, never overwritten
        if acc is not None:
            accs[node] = acc
            grads[node] = acc

    sink = _Sink(ctx, g, needs_grad)
    for i in range(n_fwd - 1, -1, -1):
        node = g.nodes[i]
        grad = grads.get(node)
        if grad is None or node.op is Op.NONE:
            continue
        rule = BACKWARD[node.op]
        sink.node = node
        sink.ignored = ignored_sources(node)
        rule(ctx, node, grad, sink)
        for s in node.src:
            sg = grads.get(s) if s is not None else None
            if sg is not None and sg.ne != s.ne:
                raise ShapeError(f"ggml_build_backward_expand: gradient of '{s.name}' has shape "
                                 f"{list(sg.ne)}, expected {list(s.ne)} (backward of "
                                 f"{node.op.name})")


def graph_get_grad(g: Graph, node: Tensor) -> Tensor | None:
    """The final gradient of ``node`` in ``g``, or None (ggml_graph_get_grad)."""
    _check_graph("ggml_graph_get_grad", g)
    return g.grads.get(node) if g.grads is not None else None


def graph_get_grad_acc(g: Graph, node: Tensor) -> Tensor | None:
    """The persistent accumulator of ``node`` in ``g``, or None (ggml_graph_get_grad_acc)."""
    _check_graph("ggml_graph_get_grad_acc", g)
    return g.grad_accs.get(node) if g.grad_accs is not None else None


def graph_reset(g: Graph | None) -> None:
    """Zero the accumulators and AdamW moments of ``g``; set the loss gradient to 1.

    ggml: ``ggml_graph_reset``.

    ``None`` is a no-op. Every affected tensor must have memory.
    """
    if g is None:
        return
    _check_graph("ggml_graph_reset", g)
    if g.grad_accs is None:
        raise StateError("ggml_graph_reset: the graph has no gradient slots")
    accs = g.grad_accs
    work: list[tuple[Tensor, float]] = []
    for node in g.nodes:
        if node.op is Op.OPT_STEP_ADAMW:
            work.append((node.src[2], 0.0))
            work.append((node.src[3], 0.0))
        acc = accs.get(node)
        if acc is None:
            continue
        if node.flags & FLAG_LOSS:
            if acc.type is not F32 or not acc.is_scalar():
                raise ShapeError("ggml_graph_reset: the loss gradient must be a scalar F32")
            work.append((acc, 1.0))
        else:
            work.append((acc, 0.0))
    memory = []
    for t, value in work:
        if t.buffer is None:
            raise StateError(f"ggml_graph_reset: '{t.name}' has no memory; allocate it first")
        memory.append((t, t.buffer, value))
    for t, buf, value in memory:
        buf.fill(t, value)

