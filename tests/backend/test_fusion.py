"""The CPU backend's one fusion (``backend/fusion.py``): a product summed in place into an
accumulator, or by a plain add into a dying operand's memory, is one step, with the same bits as
the two nodes apart."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.backend.fusion import count_uses, is_product_then_add, is_product_then_sum


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _setup(op, k=300, m=260, n=140, out_too=False, second_use=False, n_threads=2):
    """acc (static, holding acc0) += op(a, b); returns (result, acc0, product alone, steps)."""
    ctx_static, ctx = ggopt.Context(), ggopt.Context()
    if op == "mul_mat":  # [k, m] x [k, n] -> [m, n]
        a, b = ctx_static.new_tensor_2d(ggopt.F32, k, m), ctx_static.new_tensor_2d(ggopt.F32, k, n)
    else:  # out_prod: [m, k] x [n, k] -> [m, n]
        a, b = ctx_static.new_tensor_2d(ggopt.F32, m, k), ctx_static.new_tensor_2d(ggopt.F32, n, k)
    acc = ctx_static.new_tensor_2d(ggopt.F32, m, n)
    sched = gb.Scheduler([gb.cpu_init()])
    gb.alloc_ctx_tensors(ctx_static, sched.backends[0])
    av, bv, acc0 = _rand(a.shape, 1), _rand(b.shape, 2), _rand(acc.shape, 3)
    gb.tensor_set(a, av)
    gb.tensor_set(b, bv)
    gb.tensor_set(acc, acc0)
    prod = getattr(ggopt, op)(ctx, a, b)
    if out_too:
        ggopt.set_output(prod)
    summed = ggopt.add_inplace(ctx, acc, prod)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, summed)
    if second_use:
        ggopt.build_forward_expand(g, ggopt.scale(ctx, prod, 2.0))
    ggopt.set_n_threads(n_threads)
    try:
        sched.alloc_graph(g)
        sched.graph_compute(g)
        n_steps = len(sched._current.steps)
    finally:
        ggopt.set_n_threads(None)
    # the product alone, as a graph output (never fused), computed the same way
    ctx2 = ggopt.Context()
    alone = getattr(ggopt, op)(ctx2, a, b)
    ggopt.set_output(alone)
    g2 = ggopt.new_graph(ctx2)
    ggopt.build_forward_expand(g2, alone)
    sched2 = gb.Scheduler([gb.cpu_init()])
    sched2.graph_compute(g2)
    return gb.tensor_get(acc), acc0, gb.tensor_get(alone), n_steps


@pytest.mark.parametrize("op", ["mul_mat", "out_prod"])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_fused_sum_equals_product_then_add_bit_for_bit(op, n_threads):
    got, acc0, alone, n_steps = _setup(op, n_threads=n_threads)
    assert n_steps == 1  # product and add: one step
    np.testing.assert_array_equal(got, acc0 + alone)


@pytest.mark.parametrize("op", ["mul_mat", "out_prod"])
@pytest.mark.parametrize("k, m, n", [(8, 257, 45), (300, 8, 45), (300, 45, 5)], ids=str)
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_fused_thin_product_equals_product_then_add_bit_for_bit(op, k, m, n, n_threads):
    """LoRA's ``W x + B h`` and gradient sums: a thin product (ThinPlan) adds each output's
    sum into the accumulator once, the same bits as the product node alone plus the add."""
    got, acc0, alone, n_steps = _setup(op, k=k, m=m, n=n, n_threads=n_threads)
    assert n_steps == 1
    np.testing.assert_array_equal(got, acc0 + alone)
    a, b = _rand((m, k) if op == "mul_mat" else (k, m), 1), _rand((n, k) if op == "mul_mat"
                                                                  else (k, n), 2)
    ref = b.astype(np.float64) @ a.T if op == "mul_mat" else b.T.astype(np.float64) @ a
    np.testing.assert_allclose(alone, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["mul_mat", "out_prod"])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_fused_split_reduction_equals_product_then_add_bit_for_bit(op, n_threads):
    """A weight gradient's long reduction (k >= 4x the output's sides) is cut in two halves,
    summed, then added into the accumulator: the same bits as the product node alone plus
    the add, for any thread count."""
    got, acc0, alone, n_steps = _setup(op, k=2051, m=129, n=67, n_threads=n_threads)
    assert n_steps == 1
    np.testing.assert_array_equal(got, acc0 + alone)
    if op == "mul_mat":  # numpy: B (n, k) @ A (m, k).T
        ref = _rand((67, 2051), 2).astype(np.float64) @ _rand((129, 2051), 1).T
        np.testing.assert_allclose(alone, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", ["out_too", "second_use"])
def test_no_fusion_when_the_product_is_read_elsewhere(case):
    got, acc0, alone, n_steps = _setup("out_prod", **{case: True})
    assert n_steps >= 2
    np.testing.assert_array_equal(got, acc0 + alone)


def test_small_products_and_pattern_checks():
    got, acc0, alone, _ = _setup("mul_mat", k=3, m=5, n=2)
    np.testing.assert_array_equal(got, acc0 + alone)
    ctx = ggopt.Context()
    a, b = ctx.new_tensor_2d(ggopt.F32, 4, 3), ctx.new_tensor_2d(ggopt.F32, 4, 2)
    acc = ctx.new_tensor_2d(ggopt.F32, 3, 2)
    prod = ggopt.mul_mat(ctx, a, b)
    fresh = ggopt.add(ctx, acc, prod)  # not in place: not the pattern
    inplace = ggopt.add_inplace(ctx, acc, prod)
    assert not is_product_then_add(prod, fresh, count_uses([prod, fresh]))
    assert is_product_then_add(prod, inplace, count_uses([prod, inplace]))
    assert not is_product_then_add(prod, inplace, count_uses([prod, inplace, fresh]))


def _plain_sum(op, n_threads, product_first, x_in_product=False):
    """add(other, op(a, b)) (or the product first) with ``other`` computed in the graph (so
    that it dies at the add): (result, other alone + product alone, steps)."""
    k, m, n = (200, 200, 200) if x_in_product else (300, 260, 140)
    ctx_static = ggopt.Context()
    if op == "mul_mat":
        a, b = ctx_static.new_tensor_2d(ggopt.F32, k, m), ctx_static.new_tensor_2d(ggopt.F32, k, n)
    else:
        a, b = ctx_static.new_tensor_2d(ggopt.F32, m, k), ctx_static.new_tensor_2d(ggopt.F32, n, k)
    c = ctx_static.new_tensor_2d(ggopt.F32, m, n)
    sched = gb.Scheduler([gb.cpu_init()])
    gb.alloc_ctx_tensors(ctx_static, sched.backends[0])
    for t, seed in ((a, 1), (b, 2), (c, 3)):
        gb.tensor_set(t, _rand(t.shape, seed))

    def build(ctx, fused_form):
        other = ggopt.sqr(ctx, b if x_in_product else c)
        # the product reading the other operand (square shapes): never fused
        prod = getattr(ggopt, op)(ctx, a, other if x_in_product else b)
        if not fused_form:
            return other, prod
        return other, ggopt.add(ctx, prod, other) if product_first else \
            ggopt.add(ctx, other, prod)

    ggopt.set_n_threads(n_threads)
    try:
        ctx = ggopt.Context()
        other, summed = build(ctx, True)
        g = ggopt.new_graph(ctx)
        ggopt.build_forward_expand(g, other)  # the product right before the add
        ggopt.build_forward_expand(g, summed)
        sched.alloc_graph(g)
        sched.graph_compute(g)
        got, n_steps = gb.tensor_get(summed), len(sched._current.steps)
        ctx2 = ggopt.Context()
        parts = build(ctx2, False)
        g2 = ggopt.new_graph(ctx2)
        for t in parts:
            ggopt.set_output(t)
            ggopt.build_forward_expand(g2, t)
        sched2 = gb.Scheduler([gb.cpu_init()])
        sched2.graph_compute(g2)
        other, prod = (gb.tensor_get(t) for t in parts)
    finally:
        ggopt.set_n_threads(None)
    return got, other + prod, n_steps


@pytest.mark.parametrize("op", ["mul_mat", "out_prod"])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("product_first", [False, True])
def test_plain_sum_into_a_dying_operand_is_one_step_bit_for_bit(op, n_threads, product_first):
    got, want, n_steps = _plain_sum(op, n_threads, product_first)
    assert n_steps == 2  # sqr, then product and add as one step
    np.testing.assert_array_equal(got, want)


def test_no_plain_sum_when_the_product_reads_the_other_operand():
    """add(x, W x'), x' = x: summing pieces into x's memory would overwrite what the product
    still reads."""
    got, want, n_steps = _plain_sum("mul_mat", 2, False, x_in_product=True)
    assert n_steps == 3
    np.testing.assert_array_equal(got, want)


def test_plain_sum_pattern_checks():
    ctx = ggopt.Context()
    a, b = ctx.new_tensor_2d(ggopt.F32, 4, 3), ctx.new_tensor_2d(ggopt.F32, 4, 2)
    other, row = ctx.new_tensor_2d(ggopt.F32, 3, 2), ctx.new_tensor_2d(ggopt.F32, 3, 1)
    prod = ggopt.mul_mat(ctx, a, b)

    def sum_of(add, *more):
        return is_product_then_sum(prod, add, count_uses([prod, add, *more]))

    assert sum_of(ggopt.add(ctx, other, prod)) == 0
    assert sum_of(ggopt.add(ctx, prod, other)) == 1
    assert sum_of(ggopt.add_inplace(ctx, other, prod)) is None  # in place: the other pattern
    assert sum_of(ggopt.add(ctx, prod, row)) is None  # a broadcast
    assert sum_of(ggopt.add(ctx, prod, other), ggopt.sqr(ctx, prod)) is None  # read twice
    assert sum_of(ggopt.sub(ctx, other, prod)) is None
