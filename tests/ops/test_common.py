"""Checks that span several op families: refusals of wrong types, non-tensors, values the
kernels cannot take, scalars beyond float, and empty operands; and that every backward rule
belongs to a family whose test file checks its gradients.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import ggopt
from ggopt import (
    DTypeError,
    InvalidValueError,
    ShapeError,
)
from ggopt import backend as gb
from ggopt.ops import BACKWARD
from tests.support.state import assert_unchanged as _unchanged


@pytest.mark.parametrize("make", [
    lambda c, f, i: ggopt.add(c, f, i),
    lambda c, f, i: ggopt.sqr(c, i),
    lambda c, f, i: ggopt.mul_mat(c, i, f),
    lambda c, f, i: ggopt.soft_max(c, i),
    lambda c, f, i: ggopt.count_equal(c, f, f),
    lambda c, f, i: ggopt.get_rows(c, f, f),
    lambda c, f, i: ggopt.cross_entropy_loss(c, f, i),
], ids=["add", "sqr", "mul_mat", "soft_max", "count_equal", "get_rows", "cross_entropy"])
def test_wrong_dtypes(ctx, make):
    f, i = ctx.new_tensor_2d(ggopt.F32, 4, 3), ctx.new_tensor_2d(ggopt.I32, 4, 3)
    _unchanged(ctx, lambda: make(ctx, f, i), DTypeError, r"ggml_\w+: \w+ must be (F32|I32)")


def test_not_a_tensor(ctx):
    a = ctx.new_tensor_1d(ggopt.F32, 3)
    _unchanged(ctx, lambda: ggopt.add(ctx, a, np.ones(3, np.float32)), DTypeError, "Tensor")
    _unchanged(ctx, lambda: ggopt.add(None, a, a), DTypeError, "Context")


def test_other_op_validation(ctx):
    x = ctx.new_tensor_4d(ggopt.F32, 6, 6, 2, 1)
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 3, 4)
    i, i4 = ctx.new_tensor_1d(ggopt.I32, 5), ctx.new_tensor_1d(ggopt.I32, 4)
    _unchanged(ctx, lambda: ggopt.conv_2d(ctx, k, x, 1, 1, 0, 0, 1, 1), ShapeError, "channels")
    k2 = ctx.new_tensor_4d(ggopt.F32, 7, 7, 2, 4)
    _unchanged(ctx, lambda: ggopt.conv_2d(ctx, k2, x, 1, 1, 0, 0, 1, 1), ShapeError,
               "empty output")
    _unchanged(ctx, lambda: ggopt.im2col(ctx, k2, x, 0, 1, 0, 0, 1, 1), ShapeError,
               "s0 must be >= 1")
    _unchanged(ctx, lambda: ggopt.pool_2d(ctx, x, 7, 2, 2, 2, 2, 0, 0), InvalidValueError,
               "OP_POOL_MAX")
    _unchanged(ctx, lambda: ggopt.argmax(ctx, x), ShapeError, "matrix")
    _unchanged(ctx, lambda: ggopt.count_equal(ctx, i, i4), ShapeError, "differ in shape")
    _unchanged(ctx, lambda: ggopt.repeat(ctx, k, x), ShapeError, "does not tile")
    _unchanged(ctx, lambda: ggopt.permute(ctx, x, 0, 1, 1, 3), ShapeError, "permutation")
    _unchanged(ctx, lambda: ggopt.cpy(ctx, x, k), ShapeError, "elements")


def test_other_validation(ctx):
    a = ctx.new_tensor_2d(ggopt.F32, 7, 3)
    i = ctx.new_tensor_2d(ggopt.I32, 7, 3)
    a72, a62 = ctx.new_tensor_2d(ggopt.F32, 7, 2), ctx.new_tensor_2d(ggopt.F32, 6, 2)
    _unchanged(ctx, lambda: ggopt.rms_norm(ctx, i, 1e-5), DTypeError, "must be F32")
    _unchanged(ctx, lambda: ggopt.rms_norm(ctx, a, -1.0), InvalidValueError, "eps")
    _unchanged(ctx, lambda: ggopt.rms_norm_back(ctx, a, a72, 1e-5), ShapeError, "shape")
    _unchanged(ctx, lambda: ggopt.diag_mask_inf(ctx, a, -1), ShapeError, "n_past")
    _unchanged(ctx, lambda: ggopt.swiglu(ctx, a), ShapeError, "even")
    _unchanged(ctx, lambda: ggopt.swiglu_split(ctx, a, a72), ShapeError, "one shape")
    _unchanged(ctx, lambda: ggopt.add1(ctx, a, a), ShapeError, "scalar")
    _unchanged(ctx, lambda: ggopt.concat(ctx, a, a62, 0), ShapeError, "agree")
    _unchanged(ctx, lambda: ggopt.concat(ctx, a, a, 4), ShapeError, "dim")
    _unchanged(ctx, lambda: ggopt.sin(ctx, i), DTypeError, "must be F32")
    # head counts that do not divide: 4 query heads over 3 KV heads
    k, q = ctx.new_tensor_3d(ggopt.F32, 8, 5, 3), ctx.new_tensor_3d(ggopt.F32, 8, 7, 4)
    _unchanged(ctx, lambda: ggopt.mul_mat(ctx, k, q), ShapeError, "broadcast")


def _compute(out, ctx):
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    sched = gb.Scheduler([gb.cpu_init()])
    sched.graph_compute(g)
    return out


def _host_ctx():
    return ggopt.Context(no_alloc=False)


@pytest.mark.parametrize("build", [
    lambda ctx: ggopt.im2col(ctx, ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1),
                             ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), 2**31, 1, 0, 0, 1, 1),
    lambda ctx: ggopt.im2col(ctx, ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1),
                             ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), 1, 1, 2**31, 0, 1, 1),
    lambda ctx: ggopt.pool_2d(ctx, ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), ggopt.OP_POOL_MAX,
                              2, 2, 2**31, 2, 0, 0),
    lambda ctx: ggopt.pool_2d(ctx, ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), ggopt.OP_POOL_AVG,
                              0, 2, 1, 1, 0, 0),
    lambda ctx: ggopt.pool_2d(ctx, ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), ggopt.OP_POOL_AVG,
                              2, -1, 1, 1, 0, 0),
    lambda ctx: ggopt.cross_entropy_loss(ctx, ctx.new_tensor_2d(ggopt.F32, 0, 3),
                                         ctx.new_tensor_2d(ggopt.F32, 0, 3)),
])
def test_ops_refuse_values_the_kernels_cannot_take(build):
    ctx = ggopt.Context()
    with pytest.raises(ShapeError):
        build(ctx)


@pytest.mark.parametrize("build", [
    lambda ctx: ggopt.scale(ctx, ctx.new_tensor_1d(ggopt.F32, 3), 10**400),
    lambda ctx: ggopt.soft_max_ext(ctx, ctx.new_tensor_1d(ggopt.F32, 3), None, -(10**400), 0.0),
])
def test_ops_refuse_scalars_beyond_float(build):
    ctx = ggopt.Context()
    with pytest.raises(InvalidValueError, match="must fit in a float"):
        build(ctx)


@pytest.mark.parametrize("build, ne", [
    (lambda ctx: ggopt.mul_mat(ctx, ctx.new_tensor_2d(ggopt.F32, 3, 2),
                               ctx.new_tensor_3d(ggopt.F32, 3, 4, 0)), (2, 4, 0, 1)),
    (lambda ctx: ggopt.add(ctx, ctx.new_tensor_2d(ggopt.F32, 0, 3),
                           ctx.new_tensor_2d(ggopt.F32, 0, 3)), (0, 3, 1, 1)),
    (lambda ctx: ggopt.mul_mat(ctx, ctx.new_tensor_2d(ggopt.F32, 3, 2),
                               ctx.new_tensor_2d(ggopt.F32, 3, 0)), (2, 0, 1, 1)),
    (lambda ctx: ggopt.sum(ctx, ctx.new_tensor_2d(ggopt.F32, 0, 3)), (1, 1, 1, 1)),
])
def test_empty_operands_compute(build, ne):
    ctx = _host_ctx()
    out = build(ctx)
    assert out.ne == ne
    _compute(out, ctx)
    assert np.all(out.numpy() == 0.0)


def test_every_backward_rule_has_gradient_cases_in_its_family_file():
    """Each backward rule lives in ggopt/ops/<family>.py, whose tests/ops/test_<family>.py has a
    CASES table and the coverage test that fails until the rule has a case."""
    families = {BACKWARD[op].__module__.rpartition(".")[2] for op in BACKWARD}
    for family in families:
        path = Path(__file__).with_name(f"test_{family}.py")
        assert path.is_file(), f"ggopt/ops/{family}.py has backward rules but no {path.name}"
        tree = ast.parse(path.read_text())
        names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name)}
        names |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"CASES", "test_op_gradient", "test_cases_cover_every_backward_rule"} <= names
