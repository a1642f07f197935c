"""Graphs with BF16 and F16 tensors: cpy between BF16 and F32 (ggml's rounding), get_rows of
low-precision rows, mul_mat and out_prod of a low-precision weight (the other operand rounded
to the weight's type, F32 sums) on the CPU backend and the NumPy array backend, finite-difference
gradients through the activations, a gradient through cpy into an F32 master weight, and the
refusals."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.backend.array.backend import numpy_backend
from ggopt.errors import DTypeError, ShapeError
from ggopt.lowp import bf16_from_f32, f32_from_bf16, round_to
from ggopt.types import BF16, F16, F32, GGType
from tests.support.helpers import check_grads

LOWP = [BF16, F16]


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _as(ctx: ggopt.Context, t: GGType, x: ggopt.Tensor) -> ggopt.Tensor:
    """``x`` (F32) converted to ``t`` inside the graph."""
    return ggopt.cpy(ctx, x, ctx.new_tensor(t, x.ne))


def _compute(build, inputs: list[np.ndarray], backend: gb.Backend) -> list[np.ndarray]:
    ctx = ggopt.Context()
    ins = [ctx.new_tensor(F32 if a.dtype == np.float32 else GGType.I32, a.shape[::-1])
           for a in inputs]
    for t in ins:
        ggopt.set_input(t)
    outs = build(ctx, *ins)
    outs = [outs] if isinstance(outs, ggopt.Tensor) else list(outs)
    gf = ggopt.new_graph_custom(ctx, 256, False)
    for o in outs:
        ggopt.set_output(o)
        ggopt.build_forward_expand(gf, o)
    gb.alloc_ctx_tensors(ctx, backend)
    for t, a in zip(ins, inputs):
        gb.tensor_set(t, a)
    sched = gb.Scheduler([backend] if backend.is_host else [backend, gb.cpu_init()])
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    return [gb.tensor_get(o) for o in outs]


def _eighths(*shape: int, seed: int = 0) -> np.ndarray:
    """Multiples of 1/8 in [-2, 2]: they and their neighbours +-1/8 are exact in F16 and BF16,
    so central differences with eps = 1/8 see no rounding of the perturbed operand."""
    return (np.random.default_rng(seed).integers(-16, 17, shape) / 8).astype(np.float32)


def _ref_product(t: GGType, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """ggml's rule in float64: x rounded to t, w's values already t's."""
    return round_to(t, x).astype(np.float64) @ round_to(t, w).astype(np.float64).T


@pytest.mark.parametrize("t", LOWP, ids=lambda t: t.name)
def test_mul_mat_rounds_the_activations_to_the_weight_type(t):
    w, x = _f32(37, 67, seed=1), _f32(2, 5, 67, seed=2)

    def build(ctx, wt, xt):
        return ggopt.mul_mat(ctx, _as(ctx, t, wt), xt)

    got = [_compute(build, [w, x], be)[0]
           for be in (gb.cpu_init(1), gb.cpu_init(2), gb.cpu_init(3), numpy_backend())]
    for g in got[1:3]:
        np.testing.assert_array_equal(g.view(np.uint32), got[0].view(np.uint32))
    ref = _ref_product(t, x, w)
    # sums of 67 products in F32: a few ulps of the sum of magnitudes
    bound = 67 * np.finfo(np.float32).eps * (np.abs(round_to(t, x)) @ np.abs(round_to(t, w)).T)
    for g in (got[0], got[3]):
        assert np.all(np.abs(g - ref) <= bound)
    # rounding the activations is visible: the F32 product of the same weight differs
    assert not np.allclose(got[0], x @ round_to(t, w).T, rtol=0, atol=1e-6)


@pytest.mark.parametrize("t", LOWP, ids=lambda t: t.name)
def test_out_prod_rounds_the_gradient_to_the_weight_type(t):
    w, g = _f32(9, 33, seed=3), _f32(4, 9, seed=4)   # w (M rows, K_in), g (N, M)

    def build(ctx, wt, gt):  # dx = g @ w, as mul_mat's backward builds it
        return ggopt.out_prod(ctx, _as(ctx, t, wt), ggopt.transpose(ctx, gt))

    cpu1, cpu2, ref = (_compute(build, [w, g], be)[0]
                       for be in (gb.cpu_init(1), gb.cpu_init(2), numpy_backend()))
    np.testing.assert_array_equal(cpu1.view(np.uint32), cpu2.view(np.uint32))
    want = round_to(t, g).astype(np.float64) @ round_to(t, w).astype(np.float64)
    np.testing.assert_allclose(cpu1, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", LOWP, ids=lambda t: t.name)
def test_gradient_through_x_matches_finite_differences(t):
    # The product rounds x to t and the backward rounds the incoming gradient: x is perturbed
    # on t's grid and the loss's weights c are on it too (see _eighths), so only F32 sums round.
    def loss(ctx, x, wt, c):
        return ggopt.sum(ctx, ggopt.mul(ctx, ggopt.mul_mat(ctx, _as(ctx, t, wt), x), c))

    check_grads(loss, _eighths(3, 40, seed=6), _f32(6, 40, seed=5), _eighths(3, 6, seed=11),
                params=(0,), eps=0.125, weighted=False)


def test_gradient_through_cpy_reaches_the_f32_master_weight():
    """A BF16 copy of an F32 parameter: its product's weight gradient flows back through cpy
    (the full fine-tune's recipe), equal to the F32 product's gradient with x rounded."""
    def loss(ctx, wt, x, c):
        return ggopt.sum(ctx, ggopt.mul(ctx, ggopt.mul_mat(ctx, _as(ctx, BF16, wt), x), c))

    # x on the grid too: the weight's gradient is out_prod(x, g) in F32 (ggml's), with x as given
    check_grads(loss, _eighths(5, 24, seed=8), _eighths(3, 24, seed=7), _eighths(3, 5, seed=12),
                params=(0,), eps=0.125, weighted=False)


def test_cpy_converts_as_ggml():
    x = np.concatenate([_f32(40, seed=9), np.array(
        [np.nan, -np.inf, np.inf, 0.0, -0.0, 1e-40, -3e-39, 3.4e38, 1.00390625, 1.01171875],
        np.float32)]).reshape(2, 25)
    bits = bf16_from_f32(x)

    def build(ctx, xt):
        b = _as(ctx, BF16, xt)
        return b, ggopt.cpy(ctx, b, ctx.new_tensor(F32, (25, 2)))

    for be in (gb.cpu_init(2), numpy_backend()):
        b, back = _compute(build, [x], be)
        np.testing.assert_array_equal(b, bits)
        np.testing.assert_array_equal(back.view(np.uint32), f32_from_bf16(bits).view(np.uint32))
    # ties to even, NaN quiet, subnormals kept (this ggml does not flush them)
    assert bits[1, 23] == 0x3F80 and bits[1, 24] == 0x3F82
    assert bits[1, 15] == 0x7FC0 and f32_from_bf16(bits)[1, 20] != 0


@pytest.mark.parametrize("t", LOWP, ids=lambda t: t.name)
def test_get_rows_of_low_precision_rows(t):
    e = _f32(11, 8, seed=10)
    ids = np.array([3, 10, 0, 3], np.int32)

    def build(ctx, et, it):
        return ggopt.get_rows(ctx, _as(ctx, t, et), it)

    for be in (gb.cpu_init(2), numpy_backend()):
        (h,) = _compute(build, [e, ids], be)
        np.testing.assert_array_equal(h, round_to(t, e)[ids])


def test_refusals_before_anything_runs():
    ctx = ggopt.Context()
    wb = ctx.new_tensor(BF16, (8, 4))
    x = ctx.new_tensor(F32, (8, 3))
    with pytest.raises(DTypeError, match="BF16"):
        ggopt.cpy(ctx, wb, ctx.new_tensor(F16, (8, 4)))
    with pytest.raises(DTypeError, match="BF16"):
        ggopt.cpy(ctx, ctx.new_tensor(GGType.I32, (8, 4)), wb)
    with pytest.raises(DTypeError):
        ggopt.mul_mat(ctx, x, ggopt.cont(ctx, wb))   # b must be F32
    with pytest.raises(ShapeError):
        ggopt.mul_mat(ctx, ggopt.transpose(ctx, wb), x)
    with pytest.raises(DTypeError, match="BF16"):
        ggopt.add(ctx, wb, wb)


def test_no_gradient_to_b_through_out_prod_of_a_bf16_weight():
    ctx = ggopt.Context()
    wb = ctx.new_tensor(BF16, (8, 4))
    g = ctx.new_tensor(F32, (3, 4))
    ggopt.set_param(g)
    loss = ggopt.sum(ctx, ggopt.out_prod(ctx, wb, g))
    ggopt.set_loss(loss)
    gf = ggopt.new_graph_custom(ctx, 64, True)
    ggopt.build_forward_expand(gf, loss)
    with pytest.raises(DTypeError, match="BF16"):
        ggopt.build_backward_expand(ctx, gf, None)


def test_bf16_type_facts():
    assert (BF16.value, BF16.size, BF16.blck_size, BF16.dtype) == (30, 2, 1, np.uint16)
    assert BF16.is_lowp and F16.is_lowp and not F32.is_lowp and not BF16.is_quantized
    with pytest.raises(DTypeError):
        ggopt.types.from_np_dtype(np.uint16)


def _bf16_leaf_product(w_bits: np.ndarray, x: np.ndarray, threads: int = 2):
    """mul_mat and out_prod of a BF16 leaf weight (a frozen base's matrix): the backend, the
    weight and a function computing both products for x."""
    from ggopt.backend.cpu.ops.lowp import PACKED

    be = gb.cpu_init(threads)
    ctx = ggopt.Context()
    w = ctx.new_tensor(BF16, w_bits.shape[::-1])
    xt = ctx.new_tensor(F32, x.shape[::-1])
    g = ctx.new_tensor(F32, (x.shape[0], w_bits.shape[0]))
    ggopt.set_input(xt)
    ggopt.set_input(g)
    y = ggopt.mul_mat(ctx, w, xt)
    dx = ggopt.out_prod(ctx, w, g)
    gf = ggopt.new_graph_custom(ctx, 64, False)
    for o in (y, dx):
        ggopt.set_output(o)
        ggopt.build_forward_expand(gf, o)
    gb.alloc_ctx_tensors(ctx, be)
    gb.tensor_set(w, w_bits)
    sched = gb.Scheduler([be])
    sched.alloc_graph(gf)
    gy = _f32(x.shape[0], w_bits.shape[0], seed=31)

    def run():
        gb.tensor_set(xt, x)
        gb.tensor_set(g, np.ascontiguousarray(gy.T))
        sched.graph_compute(gf)
        return gb.tensor_get(y), gb.tensor_get(dx)

    return PACKED, w, run


def test_a_constant_bf16_weight_is_packed_once_and_never_stale(monkeypatch):
    w_bits, x = bf16_from_f32(_f32(70, 40, seed=21)), _f32(9, 40, seed=22)
    PACKED_, w, run = _bf16_leaf_product(w_bits, x)
    PACKED_.clear()
    monkeypatch.setattr(PACKED_, "enabled", True)
    y1, dx1 = run()
    held = PACKED_.nbytes()
    assert held >= 2 * w_bits.nbytes                # mul_mat's and out_prod's panels
    assert held < 2 * w_bits.nbytes * 1.5           # padding to 48 outputs at most
    np.testing.assert_allclose(y1, _ref_product(BF16, x, f32_from_bf16(w_bits)), rtol=1e-5,
                               atol=1e-5)
    y2, dx2 = run()                                 # from the cache: the same bits
    assert PACKED_.nbytes() == held
    np.testing.assert_array_equal(y2.view(np.uint32), y1.view(np.uint32))
    np.testing.assert_array_equal(dx2.view(np.uint32), dx1.view(np.uint32))
    PACKED_.enabled = False
    try:
        y3, dx3 = run()                             # packed per call: the same bits
    finally:
        PACKED_.enabled = True
    np.testing.assert_array_equal(y3.view(np.uint32), y1.view(np.uint32))
    np.testing.assert_array_equal(dx3.view(np.uint32), dx1.view(np.uint32))
    changed = w_bits.copy()
    changed[33, 7] ^= 0x0040                        # one bit of one weight
    gb.tensor_set(w, changed)
    y4, _ = run()
    np.testing.assert_allclose(y4, _ref_product(BF16, x, f32_from_bf16(changed)), rtol=1e-5,
                               atol=1e-5)
    assert not np.array_equal(y4[:, 33], y1[:, 33]) and np.array_equal(y4[:, :33], y1[:, :33])
    PACKED_.enabled = False
    try:
        y5, _ = run()
    finally:
        PACKED_.enabled = True
    np.testing.assert_array_equal(y5.view(np.uint32), y4.view(np.uint32))
    PACKED_.clear()


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_cpy_f32_to_bf16_in_a_graph_for_every_thread_count(n_threads):
    x = np.concatenate([_f32(200_000, seed=23), np.array(
        [np.nan, -np.inf, np.inf, 0.0, -0.0, 1e-40, -3e-39, 3.4e38, 1.00390625, 1.01171875],
        np.float32)]).reshape(2, -1)

    def build(ctx, xt):
        b = _as(ctx, BF16, xt)
        return b, ggopt.cpy(ctx, b, ctx.new_tensor(F32, xt.ne))

    b, back = _compute(build, [x], gb.cpu_init(n_threads))
    np.testing.assert_array_equal(b, bf16_from_f32(x))
    np.testing.assert_array_equal(back.view(np.uint32), f32_from_bf16(b).view(np.uint32))


def test_a_bf16_weights_own_gradient_is_a_bf16_product():
    """The gradient of a BF16 copy of an F32 master weight is autocast's: x and the incoming
    gradient rounded to BF16, F32 sums (out_prod of cpy(x -> BF16)); an F32 weight's stays the
    F32 product of the values as given."""
    from tests.support.helpers import GradProblem

    w, x, c = _f32(5, 24, seed=41), _f32(7, 24, seed=42), _f32(7, 5, seed=43)

    def loss(t):
        def build(ctx, wt, xt, ct):
            wb = _as(ctx, t, wt) if t is BF16 else wt
            return ggopt.sum(ctx, ggopt.mul(ctx, ggopt.mul_mat(ctx, wb, xt), ct))
        return build

    got = GradProblem(loss(BF16), [w, x, c], params=(0,), weighted=False).analytic()[0]
    rounded = round_to(BF16, c).astype(np.float64).T @ round_to(BF16, x).astype(np.float64)
    plain = c.astype(np.float64).T @ x.astype(np.float64)
    np.testing.assert_allclose(got, rounded, rtol=1e-5, atol=1e-5)
    assert np.abs(got - plain).max() > 10 * np.abs(got - rounded).max()
    f32 = GradProblem(loss(F32), [w, x, c], params=(0,), weighted=False).analytic()[0]
    np.testing.assert_allclose(f32, plain, rtol=1e-5, atol=1e-5)
    assert np.abs(f32 - plain).max() < np.abs(got - plain).max() / 10
