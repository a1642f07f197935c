"""The elementwise op family (add sub mul div scale sqr sqrt log and the unary functions) through
graphs: forward values against NumPy (1 and 2 threads, odd sizes, views), every refusal of its
constructors (with nothing changed), and finite-difference gradients of its backward rules
(CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import ShapeError
from ggopt.tensor import UnaryOp
from tests.support.arrays import (
    LAYOUTS,
    away_from_zero,
    f32,
    layout_input,
    tile_to,
)
from tests.support.grad_inputs import away, backward_rules_of, case_ops, u32
from tests.support.helpers import assert_close, check_grads, run, run1
from tests.support.sizes import LARGE
from tests.support.state import assert_unchanged as _unchanged

BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


# NumPy shapes (a, b); b tiles a.
BROADCASTS = [
    ((3, 5), (3, 5)),
    ((3, 5), (1, 5)),            # ggml b=[5,1] over a=[5,3]
    ((3, 5), (3, 1)),            # ggml b=[1,3] over a=[5,3]
    ((2, 3, 5), (1, 3, 5)),      # ggml b=[5,3,1] over a=[5,3,2]
    ((2, 3, 5), (1, 1, 1)),
    ((4, 9), (2, 3)),            # general tiling, not only size-1 broadcasting
    ((2, 3, 4, 5), (2, 1, 2, 5)),
    (LARGE, (1, LARGE[1])),      # above the parallel threshold
]


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_binary_broadcast(rng, name, shapes):
    a, b = f32(rng, *shapes[0]), away_from_zero(rng, *shapes[1])
    out = run1(lambda c, x, y: getattr(ggopt, name)(c, x, y), a, b)
    assert out.shape == a.shape
    assert_close(out, BINARY[name](a, tile_to(b, a.shape)))


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_non_contiguous(rng, name):
    # a is a transpose, b a permute of 3-D data broadcast over a's dim 2.
    a = f32(rng, 2, 5, 7)          # ggml [7,5,2]; transpose -> [5,7,2] = NumPy (2,7,5)
    b = away_from_zero(rng, 5, 1)  # ggml [1,5]; transpose -> [5,1]

    def build(c, x, y):
        return getattr(ggopt, name)(c, ggopt.transpose(c, x), ggopt.transpose(c, y))

    out = run1(build, a, b)
    ref = BINARY[name](a.swapaxes(1, 2), tile_to(b.T[None], (2, 7, 5)))
    assert_close(out, ref)


@pytest.mark.usefixtures("n_threads")
def test_add_inplace_is_view_of_a(rng):
    a, b = f32(rng, 3, 5), f32(rng, 1, 5)

    def build(c, x, y):
        r = ggopt.add_inplace(c, x, y)
        assert r.view_src is x
        return r

    assert_close(run1(build, a, b), a + b)


def gelu_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


UNARY = {
    "sqr": (np.square, (-2, 2)),
    "sqrt": (np.sqrt, (0.1, 4)),
    "log": (np.log, (0.1, 4)),
    "neg": (np.negative, (-2, 2)),
    "exp": (np.exp, (-3, 3)),
    "abs": (np.abs, (-2, 2)),
    "relu": (lambda x: np.maximum(x, 0), (-2, 2)),
    "gelu": (gelu_ref, (-4, 4)),
    "silu": (lambda x: x / (1 + np.exp(-x.astype(np.float64))), (-6, 6)),
    "tanh": (np.tanh, (-3, 3)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x.astype(np.float64))), (-8, 8)),
    "step": (lambda x: (x > 0).astype(np.float32), (-2, 2)),
}


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(rng, name, layout):
    ref_fn, (lo, hi) = UNARY[name]
    x, view, xin = layout_input(rng, layout, lo, hi)
    if name in ("relu", "step", "abs"):
        x.reshape(-1)[::7] = 0.0  # the kinks: relu(0) = step(0) = abs(0) = 0
    out = run1(lambda c, t: getattr(ggopt, name)(c, view(c, t)), x)
    assert_close(out, ref_fn(xin), rtol=2e-6, atol=1e-6)


@pytest.mark.usefixtures("n_threads")
def test_unary_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    relu, step, absx = run(lambda c, t: [ggopt.relu(c, t), ggopt.step(c, t), ggopt.abs(c, t)], x)
    np.testing.assert_array_equal(relu[:4], [0, 0, np.inf, 0])
    np.testing.assert_array_equal(step[:4], [0, 0, 1, 0])
    np.testing.assert_array_equal(absx[:4], [0, 0, np.inf, np.inf])
    assert np.isnan(absx[4])


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_scale(rng, layout):
    x, view, xin = layout_input(rng, layout, -2, 2)
    assert_close(run1(lambda c, t: ggopt.scale(c, view(c, t), -0.37), x), np.float32(-0.37) * xin)


@pytest.mark.usefixtures("n_threads")
def test_scale_inplace(rng):
    x = f32(rng, 4, 3)
    assert_close(run1(lambda c, t: ggopt.scale_inplace(c, t, 2.5), x), 2.5 * x)


def test_add_shape_mismatch(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 5, 3), ctx.new_tensor_2d(ggopt.F32, 2, 3)
    _unchanged(ctx, lambda: ggopt.add(ctx, a, b), ShapeError, r"ggml_add.*\[2, 3, 1, 1\].*\[5, 3")
    _unchanged(ctx, lambda: ggopt.mul(ctx, b, a), ShapeError, "ggml_mul")


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "add": (g.add, [u32(3, 5), u32(3, 5, seed=1)], (0, 1)),
    "add_bias_broadcast": (g.add, [u32(4, 5), u32(1, 5, seed=1)], (0, 1)),
    "add_tile": (g.add, [u32(4, 6), u32(2, 3, seed=1)], (0, 1)),
    "sub": (g.sub, [u32(3, 5), u32(3, 5, seed=1)], (0, 1)),
    "sub_broadcast": (g.sub, [u32(2, 3, 5), u32(1, 3, 5, seed=1)], (0, 1)),
    "mul": (g.mul, [u32(3, 5), u32(3, 5, seed=1)], (0, 1)),
    "mul_broadcast": (g.mul, [u32(3, 5), u32(3, 1, seed=1)], (0, 1)),
    "div": (g.div, [u32(3, 5), away(3, 5, seed=1)], (0, 1)),
    "div_broadcast": (g.div, [u32(2, 3, 4), away(1, 3, 1, seed=1)], (0, 1)),
    "scale": (lambda c, a: g.scale(c, a, -1.7), [u32(3, 5)], (0,)),
    "sqr": (g.sqr, [u32(3, 5)], (0,)),
    "sqrt": (g.sqrt, [u32(3, 5, lo=0.5, hi=3.0)], (0,)),
    "log": (g.log, [u32(3, 5, lo=0.5, hi=3.0)], (0,)),
    "neg": (g.neg, [u32(3, 5)], (0,)),
    "exp": (g.exp, [u32(3, 5)], (0,)),
    "abs": (g.abs, [away(3, 5)], (0,)),
    "relu": (g.relu, [away(3, 5)], (0,)),
    "gelu": (g.gelu, [u32(3, 5, lo=-3, hi=3)], (0,)),
    "silu": (g.silu, [u32(3, 5, lo=-4, hi=4)], (0,)),
    "tanh": (g.tanh, [u32(3, 5)], (0,)),
    "sigmoid": (g.sigmoid, [u32(3, 5, lo=-4, hi=4)], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/elementwise.py (and every unary function but
    step) has a case above."""
    ops, uops = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.elementwise")
    assert rules and rules - ops == set()
    assert set(UnaryOp) - uops == {UnaryOp.STEP}
