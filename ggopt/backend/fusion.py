"""Node pairs a backend may compute as one step, found from the graph alone.

The one fusion today: a matrix product whose only use is the in-place add that sums it into a
gradient accumulator (``add_inplace(grad_acc, out_prod(...))``, what ggml's backward pass builds
for every parameter when gradients accumulate over micro-batches). The CPU backend adds each
piece of the product into the accumulator on the thread that computed it, while the piece is
still in that core's cache, instead of in a second pass over both tensors. The arithmetic is
the two nodes' own (the product, then one float add per element), so the bits are the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ..tensor import Op, Tensor
from ..types import F32, TensorFlag

__all__ = ["count_uses", "is_product_then_add"]

_PRODUCTS = (Op.MUL_MAT, Op.OUT_PROD)


def count_uses(nodes: Sequence[Tensor]) -> Counter[Tensor]:
    """How many times ``nodes`` read each tensor: as a source or as a view's source."""
    uses: Counter[Tensor] = Counter()
    for node in nodes:
        for s in node.src:
            if s is not None:
                uses[s] += 1
        if node.view_src is not None:
            uses[node.view_src] += 1
    return uses


def is_product_then_add(prod: Tensor, add: Tensor, uses: Mapping[Tensor, int]) -> bool:
    """True when ``add`` is ``add_inplace(acc, prod)``, elementwise (no broadcast), and nothing
    else reads ``prod``, which is not a graph output and whose sources are not ``acc``."""
    if prod.op not in _PRODUCTS or add.op is not Op.ADD or add.src[1] is not prod:
        return False
    acc = add.src[0]
    if acc is None or add.view_src is not acc or add.view_offs != 0:
        return False
    if uses.get(prod, 0) != 1 or prod.flags & TensorFlag.OUTPUT or prod.view_src is not None:
        return False
    if prod.type is not F32 or add.type is not F32 or prod.ne != add.ne or acc.ne != add.ne:
        return False
    if any(s is not None and s.type.is_quantized for s in prod.src):
        return False  # a quantized weight's products have kernels of their own
    owner = acc.data_owner()
    return all(s is None or s.data_owner() is not owner for s in prod.src)
