"""Recomputing cheap activations instead of holding them: compute memory for a little time.

A training graph reads some forward results twice: right away (the forward pass) and again
far later (their backward). Between the two reads the memory planner must hold them, and for a
language model the gated FFN's activation ``glu(gate, up)`` is such a tensor (256 x 1536 F32
per layer for SmolLM2, 47 MB over its 30 layers) although its sources ``gate`` and ``up`` are
held for their own backward anyway. For such a node the scheduler runs a second copy of it
(the same op, parameters and sources) just before its first late reader and points the late
readers at the copy; the original dies after its early readers, the copy after the late ones.
The kernel, its inputs and their bits are the same, so the results are too (ggml's allocator
has no such step; nothing a caller can read changes but the memory needed).

A node qualifies when its op is cheap and elementwise (:data:`RECOMPUTED_OPS`), it is not a
view, has no views, is not a graph input or output, has no memory of its own yet and is not
written in place later, it has
readers after a gap of at least :data:`MIN_GAP` nodes, and every source is held anyway at the
copy's place: a tensor with memory of its own (a weight) or one read at or after that place,
which no node writes in place (an optimizer step, an in-place add) and which is not itself
recomputed. The copies are made only when the memory plan with them is smaller than without
(a small graph's peak may lie elsewhere, and a copy can fragment the free space).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..context import Context
from ..tensor import VIEW_OPS, Op, Tensor
from ..types import FLAG_INPUT, FLAG_OUTPUT
from .alloc import plan_memory

__all__ = ["RECOMPUTED_OPS", "MIN_GAP", "Recompute", "recomputable", "plan_recompute"]

#: Ops cheap enough to run twice: elementwise activations, whose sources their own backward
#: keeps alive.
RECOMPUTED_OPS = frozenset({Op.GLU, Op.UNARY})
#: Nodes between two reads of a tensor from which the later reads take a recomputed copy.
MIN_GAP = 64


class Recompute:
    """The nodes in execution order with the copies inserted, and the sources of the readers
    that read a copy instead of the original."""

    __slots__ = ("nodes", "sources", "copies")

    def __init__(self, nodes: list[Tensor], sources: dict[Tensor, tuple[Tensor, ...]],
                 copies: list[Tensor]) -> None:
        self.nodes = nodes
        self.sources = sources
        self.copies = copies


def _written(nodes: Sequence[Tensor]) -> set[Tensor]:
    """Tensors some node writes besides creating them: in-place results (views) and the
    optimizer's parameters and moments."""
    out: set[Tensor] = set()
    for node in nodes:
        if node.view_src is not None and node.op not in VIEW_OPS:
            out.add(node.data_owner())
        if node.op is Op.OPT_STEP_ADAMW:
            out.update(s.data_owner() for s in node.src if s is not None)
    return out


def recomputable(nodes: Sequence[Tensor], min_gap: int = MIN_GAP) -> dict[Tensor, int]:
    """The nodes that qualify (module docstring), each with the position in ``nodes`` of its
    first reader after a gap of ``min_gap`` nodes."""
    pos = {n: i for i, n in enumerate(nodes)}
    readers: dict[Tensor, list[int]] = {}
    viewed: set[Tensor] = set()
    for i, node in enumerate(nodes):
        if node.view_src is not None:
            viewed.add(node.view_src)
        for s in node.src:
            if s is not None:
                readers.setdefault(s, []).append(i)
    written = _written(nodes)
    chosen: dict[Tensor, int] = {}  # node -> index of its first late reader
    for node in nodes:
        if (node.op not in RECOMPUTED_OPS or node.view_src is not None or node in viewed
                or node.flags & (FLAG_INPUT | FLAG_OUTPUT) or node.buffer is not None
                or node in written):
            continue
        prev, late = pos[node], None
        for r in readers.get(node, ()):
            if r - prev >= min_gap:
                late = r
                break
            prev = r
        if late is None:
            continue
        if all(s is None or (s not in chosen and s.data_owner() not in written and (
                s.buffer is not None or readers[s][-1] >= late)) for s in node.src):
            chosen[node] = late
    return chosen


def plan_recompute(nodes: Sequence[Tensor], leafs: Iterable[Tensor], ctx: Context
                   ) -> Recompute | None:
    """The copies worth making in a graph of one backend (``nodes`` in execution order), created
    in ``ctx``; None when there are none or they would not make its memory plan smaller."""
    chosen = recomputable(nodes)
    if not chosen:
        return None
    before: dict[int, list[Tensor]] = {}
    swap: dict[Tensor, Tensor] = {}
    copies = []
    for node, late in chosen.items():
        copy = Tensor(ctx, node.type, node.ne, node.nb, node.op, node.src, node.op_params)
        copy.name = f"{node.name}#recomputed"
        before.setdefault(late, []).append(copy)
        swap[node] = copy
        copies.append(copy)
    sources: dict[Tensor, tuple[Tensor, ...]] = {}
    out: list[Tensor] = []
    for i, node in enumerate(nodes):
        out.extend(before.get(i, ()))
        if any(s in swap and i >= chosen[s] for s in node.src if s is not None):
            sources[node] = tuple(swap[s] if s in swap and i >= chosen[s] else s
                                  for s in node.src)
        out.append(node)
    leafs = list(leafs)
    if plan_memory(out, leafs, sources=sources).size >= plan_memory(list(nodes), leafs).size:
        return None
    return Recompute(out, sources, copies)
