"""Node pairs a backend may compute as one step, found from the graph alone.

The one fusion today: a matrix product whose only use is an add, computed as one step. Either
the in-place add that sums it into a gradient accumulator (``add_inplace(grad_acc,
out_prod(...))``, what ggml's backward pass builds for every parameter when gradients accumulate
over micro-batches), or a plain ``add(other, product)`` whose result the memory planner put in
``other``'s memory (``other`` dies there: a LoRA'd projection's ``W x + B (s A x)``, the sum of a
tensor's gradients from its several uses); the backend checks the memory
(:func:`is_product_then_sum` finds the pattern). The CPU backend adds each piece of the product
into the accumulator on the thread that computed it, while the piece is still in that core's
cache, instead of in a second pass over both tensors, and runs one parallel region instead of
two. The arithmetic is the two nodes' own (the product, then one float add per element, which
is commutative), so the bits are the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ..tensor import Op, Tensor
from ..types import F32, TensorFlag

__all__ = ["count_uses", "is_product_then_add", "is_product_then_sum"]

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


def _summable(prod: Tensor, add: Tensor, other: Tensor | None,
              uses: Mapping[Tensor, int]) -> bool:
    """``add`` sums the F32 product ``prod`` (read nowhere else, not an output) and ``other``
    element for element, and no source of ``prod`` is ``other``'s memory."""
    if prod.op not in _PRODUCTS or add.op is not Op.ADD or other is None or other is prod:
        return False
    if prod.op_params is not None:  # a product in ggml's order has its own kernels
        return False
    if uses.get(prod, 0) != 1 or prod.flags & TensorFlag.OUTPUT or prod.view_src is not None:
        return False
    if prod.type is not F32 or add.type is not F32 or prod.ne != add.ne or other.ne != add.ne:
        return False
    if any(s is not None and (s.type.is_quantized or s.type.is_lowp) for s in prod.src):
        return False  # a quantized or BF16/F16 weight's products have kernels of their own
    owner = other.data_owner()
    return all(s is None or s.data_owner() is not owner for s in prod.src)


def is_product_then_add(prod: Tensor, add: Tensor, uses: Mapping[Tensor, int]) -> bool:
    """True when ``add`` is ``add_inplace(acc, prod)``, elementwise (no broadcast), and nothing
    else reads ``prod``, which is not a graph output and whose sources are not ``acc``."""
    if prod.op not in _PRODUCTS or add.op is not Op.ADD:
        return False
    acc = add.src[0]
    if add.src[1] is not prod or acc is None or add.view_src is not acc or add.view_offs != 0:
        return False
    return _summable(prod, add, acc, uses)


def is_product_then_sum(prod: Tensor, add: Tensor, uses: Mapping[Tensor, int]) -> int | None:
    """The position (0 or 1) in ``add``'s sources of the tensor ``other`` when ``add`` is a
    plain (not in-place) ``add(other, prod)`` or ``add(prod, other)``, elementwise, and nothing
    else reads ``prod``, which is not a graph output and whose sources are not ``other``; else
    None. Fusing it is right only where ``add``'s result has ``other``'s memory (the backend
    checks)."""
    if prod.op not in _PRODUCTS or add.op is not Op.ADD or add.view_src is not None:
        return None
    if add.src[1] is prod:
        return 0 if _summable(prod, add, add.src[0], uses) else None
    if add.src[0] is prod:
        return 1 if _summable(prod, add, add.src[1], uses) else None
    return None
