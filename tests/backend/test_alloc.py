"""The memory planner: ggml-alloc's properties 1-5 (ggml-opt-spec §6.2)."""

from __future__ import annotations

import ggopt
from ggopt.backend.alloc import FreeList, plan_memory
from ggopt.backend.buffer import ALIGNMENT


def _chain(n: int, size: int = 100):
    """x -> sqr -> sqr -> ... (n ops), each result ``size`` floats."""
    ctx = ggopt.Context()
    x = ctx.new_tensor_1d(ggopt.F32, size)
    ggopt.set_input(x)
    t = x
    for _ in range(n):
        t = ggopt.sqr(ctx, t)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, t)
    return g, x, t


def test_free_list_best_fit_and_merge():
    fl = FreeList()
    a, b, c = fl.alloc(64), fl.alloc(128), fl.alloc(64)
    assert (a, b, c) == (0, 64, 192) and fl.high == 256
    fl.free(b, 128)
    assert fl.alloc(64) == 64  # best fit reuses the hole
    fl.free(64, 64)
    fl.free(a, 64)
    assert fl.blocks == [(0, 192)]  # neighbours merged
    fl.free(c, 64)
    assert fl.blocks == [(0, 256)]


def test_inputs_first_and_never_reused():
    g, x, out = _chain(6)
    plan = plan_memory(g.nodes, g.leafs)
    assert plan.offsets[x] == 0
    others = [plan.offsets[n] for n in g.nodes]
    assert 0 not in others


def test_inplace_chain_reuses_one_block():
    # sqr is an in-place-able op: every step can take over its parent's memory
    g, x, out = _chain(8)
    plan = plan_memory(g.nodes, g.leafs)
    assert len({plan.offsets[n] for n in g.nodes}) == 1
    assert plan.size == 2 * ((400 + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


def test_outputs_are_never_freed_or_reused():
    ctx = ggopt.Context()
    x = ctx.new_tensor_1d(ggopt.F32, 100)
    ggopt.set_input(x)
    a = ggopt.sqr(ctx, x)
    ggopt.set_output(a)
    b = ggopt.sqr(ctx, a)
    c = ggopt.sqr(ctx, b)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, c)
    plan = plan_memory(g.nodes, g.leafs)
    offs = plan.offsets
    assert offs[a] not in (offs[b], offs[c])


def test_liveness_frees_after_last_consumer():
    # mul_mat is not in-place, so each result needs its own block while its sources live
    ctx = ggopt.Context()
    w = ctx.new_tensor_2d(ggopt.F32, 16, 16)
    ggopt.set_input(w)
    t = w
    for _ in range(10):
        t = ggopt.mul_mat(ctx, w, t)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, t)
    plan = plan_memory(g.nodes, g.leafs)
    # w + at most two live products at any time, not eleven tensors
    assert plan.size <= 3 * 16 * 16 * 4
    assert len({plan.offsets[n] for n in g.nodes}) == 2


def test_tensors_with_memory_are_not_planned():
    ctx = ggopt.Context(no_alloc=False)
    w = ctx.new_tensor_1d(ggopt.F32, 8)
    cctx = ggopt.Context()
    y = ggopt.sqr(cctx, w)
    g = ggopt.new_graph(cctx)
    ggopt.build_forward_expand(g, y)
    plan = plan_memory(g.nodes, g.leafs)
    assert w not in plan.offsets and y in plan.offsets


def test_views_keep_their_source_alive():
    ctx = ggopt.Context()
    x = ctx.new_tensor_2d(ggopt.F32, 8, 8)
    ggopt.set_input(x)
    a = ggopt.sqr(ctx, x)
    v = ggopt.transpose(ctx, a)  # a view of a: a must outlive v's consumer
    c = ggopt.cont(ctx, v)
    d = ggopt.mul_mat(ctx, x, c)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, d)
    plan = plan_memory(g.nodes, g.leafs)
    assert v not in plan.offsets
    assert plan.offsets[c] != plan.offsets[a]


def test_an_add_takes_the_non_product_operand_s_memory():
    """add(prod, t) with both dying: the result takes t's memory, whichever side t is on, so
    that the product can be summed into it as one step (backend/fusion.py)."""
    ctx = ggopt.Context()
    w, x = ctx.new_tensor_2d(ggopt.F32, 8, 6), ctx.new_tensor_2d(ggopt.F32, 8, 5)
    for t in (w, x):
        ggopt.set_input(t)
    other = ggopt.sqr(ctx, ctx.new_tensor_2d(ggopt.F32, 6, 5))
    prod = ggopt.mul_mat(ctx, w, x)
    for summed in (ggopt.add(ctx, prod, other), ggopt.add(ctx, other, prod)):
        g = ggopt.new_graph(ctx)
        ggopt.build_forward_expand(g, summed)
        plan = plan_memory(g.nodes, g.leafs)
        assert plan.offsets[summed] == plan.offsets[other] != plan.offsets[prod]


def _loss_backward(ids_labels: bool, logits_output: bool):
    """``cross_entropy_loss(_ids)(W x, labels)`` and its backward to ``W``: (graph, logits,
    the logits' gradient)."""
    ctx = ggopt.Context()
    w, x = ctx.new_tensor_2d(ggopt.F32, 8, 300), ctx.new_tensor_2d(ggopt.F32, 8, 5)
    labels = ctx.new_tensor_1d(ggopt.I32, 5) if ids_labels else \
        ctx.new_tensor_2d(ggopt.F32, 300, 5)
    ggopt.set_param(w)
    for t in (x, labels):
        ggopt.set_input(t)
    logits = ggopt.mul_mat(ctx, w, x)
    if logits_output:
        ggopt.set_output(logits)
    loss = (ggopt.cross_entropy_loss_ids if ids_labels else ggopt.cross_entropy_loss)(
        ctx, logits, labels)
    ggopt.set_loss(loss)
    ggopt.set_output(loss)
    gf = ggopt.new_graph_custom(ctx, 64, True)
    ggopt.build_forward_expand(gf, loss)
    gb = ggopt.graph_dup(ctx, gf)
    ggopt.build_backward_expand(ctx, gb)
    back = next(n for n in gb.nodes if n.op.name.startswith("CROSS_ENTROPY_LOSS")
                and n.op.name.endswith("_BACK"))
    return gb, logits, back


def test_the_logits_gradient_takes_the_logits_memory():
    """The cross-entropy's backward writes over its logits when they die there (the largest
    tensor of a language model's step); not when the logits are an output."""
    for ids in (False, True):
        g, logits, back = _loss_backward(ids, logits_output=False)
        plan = plan_memory(g.nodes, g.leafs)
        assert plan.offsets[back] == plan.offsets[logits]
        g, logits, back = _loss_backward(ids, logits_output=True)
        plan = plan_memory(g.nodes, g.leafs)
        assert plan.offsets[back] != plan.offsets[logits]
