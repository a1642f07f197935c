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

A node qualifies when its op is cheap (:data:`RECOMPUTED_OPS`), it is not a view, has no
views, is not a graph input or output, has no memory of its own yet and is not written in place,
it has readers after a gap of at least :data:`MIN_GAP` nodes, and each source is either held
anyway at the copy's place (a tensor with memory of its own, a weight, or one read at or after
that place, which no node writes in place) or can itself be recomputed there from held
sources, up to :data:`MAX_CHAIN` nodes in all: a normalized and scaled input
``mul(rms_norm(x), w)``, read again by the gradients of the LoRA factors that multiply it, is
recomputed from the residual ``x`` its norm's backward holds. The copies are made only when the
memory plan with them is smaller than without (a small graph's peak may lie elsewhere, and a
copy can fragment the free space).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..context import Context
from ..tensor import VIEW_OPS, WRITTEN_SOURCES, Op, Tensor
from ..types import FLAG_INPUT, FLAG_OUTPUT
from .alloc import plan_memory

__all__ = ["RECOMPUTED_OPS", "MIN_GAP", "Recompute", "recomputable", "plan_recompute"]

#: Ops cheap enough to run twice: elementwise activations and products, row norms.
RECOMPUTED_OPS = frozenset({Op.GLU, Op.UNARY, Op.MUL, Op.RMS_NORM})
#: Nodes between two reads of a tensor from which the later reads take a recomputed copy.
MIN_GAP = 64
#: The most nodes recomputed for one late read (the node and the sources it needs again).
MAX_CHAIN = 3


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
    """Tensors some node writes besides creating them: in-place results (views: in-place ops,
    ``cpy``, the optimizer's parameters) and the sources an op updates (AdamW's moments)."""
    out: set[Tensor] = set()
    for node in nodes:
        if node.view_src is not None and node.op not in VIEW_OPS:
            out.add(node.data_owner())
        out.update(node.src[j].data_owner() for j in WRITTEN_SOURCES.get(node.op, ()))
    return out


def recomputable(nodes: Sequence[Tensor], min_gap: int = MIN_GAP
                 ) -> dict[Tensor, tuple[int, list[Tensor]]]:
    """The nodes that qualify (module docstring), each with the position in ``nodes`` of its
    first reader after a gap of ``min_gap`` nodes and the nodes to run again there, in order
    (the sources it needs recomputed, then itself)."""
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
    chosen: dict[Tensor, tuple[int, list[Tensor]]] = {}

    def cheap(t: Tensor) -> bool:
        return (t.op in RECOMPUTED_OPS and t.view_src is None and t not in viewed
                and not t.flags & (FLAG_INPUT | FLAG_OUTPUT) and t.buffer is None
                and t not in written and t not in chosen)

    def chain(t: Tensor, late: int, budget: int) -> list[Tensor] | None:
        """``t``'s sources recomputed at ``late`` where not held there, then ``t``."""
        run: list[Tensor] = []
        for s in t.src:
            if s is None or s in run:
                continue
            if s not in chosen and s.data_owner() not in written and (
                    s.buffer is not None or readers[s][-1] >= late):
                continue  # held anyway
            sub = chain(s, late, budget - len(run) - 1) if cheap(s) else None
            if sub is None:
                return None
            run += [x for x in sub if x not in run]
        return run + [t] if len(run) < budget else None

    for node in nodes:
        if not cheap(node):
            continue
        prev, late = pos[node], None
        for r in readers.get(node, ()):
            if r - prev >= min_gap:
                late = r
                break
            prev = r
        if late is None:
            continue
        run = chain(node, late, MAX_CHAIN)
        if run is not None:
            chosen[node] = (late, run)
    return chosen


def plan_recompute(nodes: Sequence[Tensor], leafs: Iterable[Tensor], ctx: Context,
                   min_gap: int = MIN_GAP) -> Recompute | None:
    """The copies worth making in a graph of one backend (``nodes`` in execution order), created
    in ``ctx``; None when there are none or they would not make its memory plan smaller."""
    chosen = recomputable(nodes, min_gap)
    if not chosen:
        return None
    before: dict[int, list[Tensor]] = {}  # position -> the copies run just before it
    swap: dict[Tensor, Tensor] = {}  # a chosen node -> its copy, for its late readers
    copies = []
    for node, (late, run) in chosen.items():
        made: dict[Tensor, Tensor] = {}  # the chain's nodes -> their copies
        for t in run:
            copy = Tensor(ctx, t.type, t.ne, t.nb, t.op,
                          tuple(made.get(s, s) for s in t.src), t.op_params)
            copy.name = f"{t.name}#recomputed"
            made[t] = copy
            before.setdefault(late, []).append(copy)
            copies.append(copy)
        swap[node] = made[node]
    sources: dict[Tensor, tuple[Tensor, ...]] = {}
    out: list[Tensor] = []
    for i, node in enumerate(nodes):
        out.extend(before.get(i, ()))
        if any(s in swap and i >= chosen[s][0] for s in node.src if s is not None):
            sources[node] = tuple(swap[s] if s in swap and i >= chosen[s][0] else s
                                  for s in node.src)
        out.append(node)
    leafs = list(leafs)
    if plan_memory(out, leafs, sources=sources).size >= plan_memory(list(nodes), leafs).size:
        return None
    return Recompute(out, sources, copies)
