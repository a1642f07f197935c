"""Undo a failed graph build: the user's graph, contexts and tensor flags as they were.

An optimization context adds the loss (and the backward and optimizer passes) to the user's
forward graph and compute context; when a later step of that build raises, everything it
added must go again, or the next alloc would find a second LOSS node in the graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from ..context import Context
from ..graph import Graph
from ..tensor import Tensor

__all__ = ["graph_rollback"]


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
