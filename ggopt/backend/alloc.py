"""Compute-memory planning: ggml-alloc's liveness-based allocator, as offsets into one buffer.

The planner walks the nodes in execution order and keeps ggml's properties (ggml-opt-spec §6.2):
tensors that already have memory are never touched, INPUT tensors are placed first, OUTPUT
tensors are never freed or reused, a tensor's memory is freed after its last consumer ran (or
after the last view of it did), and element-wise ops may take over a dying parent's memory.
Free space is a best-fit list with merging of neighbours.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping

from ..tensor import Op, Tensor
from ..types import FLAG_INPUT, FLAG_OUTPUT
from .buffer import align

__all__ = ["FreeList", "plan_memory", "INPLACE_OPS", "MemoryPlan"]

#: Ops whose kernels may write over one of their (same-layout) sources.
INPLACE_OPS = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SCALE, Op.SQR, Op.SQRT, Op.LOG, Op.UNARY,
    Op.UNARY_BACK, Op.SOFT_MAX, Op.SOFT_MAX_BACK,
    # the logits' gradient over the logits (a language model's largest tensor)
    Op.CROSS_ENTROPY_LOSS_BACK, Op.CROSS_ENTROPY_LOSS_IDS_BACK,
})


_PRODUCTS = (Op.MUL_MAT, Op.OUT_PROD)


def _inplace_candidates(node: Tensor, srcs: tuple[Tensor, ...]) -> list[Tensor]:
    """The sources (``srcs``, what ``node`` reads) whose memory it may take, in the order
    tried: an add takes a matrix product's memory last, so that the product can be summed into
    the other operand's memory as one step (``backend/fusion.py``)."""
    if node.op is not Op.ADD:
        return list(srcs)
    return sorted(srcs, key=lambda s: s is not None and s.op in _PRODUCTS)


class FreeList:
    """Best-fit allocation of aligned blocks in a growing address space."""

    def __init__(self) -> None:
        self.blocks: list[tuple[int, int]] = []  # sorted (offset, size)
        self.high = 0  # end of the used address space = the buffer size needed

    def alloc(self, size: int) -> int:
        size = align(max(size, 1))
        best = -1
        for i, (_, sz) in enumerate(self.blocks):
            if sz >= size and (best < 0 or sz < self.blocks[best][1]):
                best = i
        if best >= 0:
            off, sz = self.blocks[best]
            if sz == size:
                del self.blocks[best]
            else:
                self.blocks[best] = (off + size, sz - size)
            return off
        # Extend the address space, absorbing a free block that ends at the top.
        if self.blocks and sum(self.blocks[-1]) == self.high:
            off, _ = self.blocks.pop()
        else:
            off = self.high
        self.high = off + size
        return off

    def free(self, off: int, size: int) -> None:
        size = align(max(size, 1))
        i = bisect.bisect_left(self.blocks, (off, 0))
        self.blocks.insert(i, (off, size))
        # merge with the right neighbour, then the left one
        if i + 1 < len(self.blocks) and off + size == self.blocks[i + 1][0]:
            self.blocks[i] = (off, size + self.blocks[i + 1][1])
            del self.blocks[i + 1]
        if i > 0 and sum(self.blocks[i - 1]) == off:
            self.blocks[i - 1] = (self.blocks[i - 1][0], self.blocks[i - 1][1] + self.blocks[i][1])
            del self.blocks[i]


class MemoryPlan:
    """Offsets of the tensors one buffer holds, and the buffer size they need."""

    __slots__ = ("offsets", "size")

    def __init__(self, offsets: dict[Tensor, int], size: int) -> None:
        self.offsets = offsets
        self.size = size


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type is b.type and a.ne == b.ne and a.nb == b.nb


def plan_memory(
    nodes: list[Tensor],
    leafs: Iterable[Tensor],
    extra: Iterable[Tensor] = (),
    owns: Callable[[Tensor], bool] = lambda t: t.buffer is None,
    keep: Iterable[Tensor] = (),
    sources: Mapping[Tensor, tuple[Tensor, ...]] | None = None,
) -> MemoryPlan:
    """Plan the memory of every tensor of a graph that ``owns`` accepts.

    Parameters
    ----------
    nodes:
        Nodes in execution order; their sources are the consumers' inputs.
    leafs:
        Leafs of the graph (constants and inputs).
    extra:
        Tensors to place before anything else and never free (split-input copies).
    owns:
        Predicate: does this plan place the tensor? (Default: it has no memory yet.)
    keep:
        Tensors that must survive the whole graph (read later by another backend).
    sources:
        The sources a node reads where they are not its own ``src`` (readers of recomputed
        copies).
    """
    free = FreeList()
    offsets: dict[Tensor, int] = {}
    children: dict[Tensor, int] = {}
    views: dict[Tensor, int] = {}

    reads = sources or {}
    for node in nodes:
        if node.view_src is not None:
            views[node.view_src] = views.get(node.view_src, 0) + 1
        for s in reads.get(node, node.src):
            if s is not None:
                children[s] = children.get(s, 0) + 1

    def place(t: Tensor) -> None:
        if t in offsets or t.view_src is not None or not owns(t):
            return
        offsets[t] = free.alloc(t.nbytes())

    # Inputs first (and copies), so nothing overwrites them before they are read.
    for t in extra:
        place(t)
    for t in list(leafs) + nodes:
        if t.flags & FLAG_INPUT:
            place(t)
    pinned = set(offsets)  # never freed
    keep = set(keep)

    def release(t: Tensor) -> None:
        if t in offsets and t not in pinned and t not in keep and not t.flags & FLAG_OUTPUT:
            free.free(offsets[t], t.nbytes())
            pinned.add(t)  # freed once

    for node in nodes:
        srcs = reads.get(node, node.src)
        # sources that are leafs without memory are placed when first used
        for s in srcs:
            if s is not None:
                place(s)
        if node not in offsets and node.view_src is None and owns(node):
            reused = False
            if node.op in INPLACE_OPS:
                for s in _inplace_candidates(node, srcs):
                    if (s is not None and s in offsets and s not in pinned and s.view_src is None
                            and not s.flags & FLAG_OUTPUT and s not in keep
                            and children.get(s, 0) == 1
                            and views.get(s, 0) == 0 and _same_layout(s, node)):
                        offsets[node] = offsets[s]
                        pinned.add(s)  # its memory now belongs to node
                        reused = True
                        break
            if not reused:
                place(node)
        # the node has run: its sources lose a consumer
        for s in srcs:
            if s is None:
                continue
            children[s] -= 1
            if children[s] > 0:
                continue
            if s.view_src is not None:
                owner = s.view_src
                views[owner] = views.get(owner, 1) - 1
                if views[owner] == 0 and children.get(owner, 0) == 0:
                    release(owner)
            elif views.get(s, 0) == 0:
                release(s)
    return MemoryPlan(offsets, free.high)
