"""Bad input to the core raises the right GgoptError subclass, says what was wrong, and changes
nothing (spec: every ggml assert becomes a raise before any state changes)."""

from __future__ import annotations

import numpy as np
import pytest
from _state import observable_state

import ggopt
from ggopt import DTypeError, GgoptError, InvalidValueError, ShapeError, StateError
from ggopt import backend as gb


@pytest.fixture
def ctx() -> ggopt.Context:
    return ggopt.Context()


def _unchanged(ctx: ggopt.Context, fn, exc, match: str) -> None:
    """``fn()`` raises ``exc`` matching ``match`` and changes nothing in ``ctx``: no tensor added,
    no flag, name, shape or datum of any of its tensors changed."""
    before = observable_state(ctx)
    with pytest.raises(exc, match=match) as info:
        fn()
    assert isinstance(info.value, GgoptError)
    assert observable_state(ctx) == before


def test_error_classes_are_builtin_subclasses():
    assert issubclass(ShapeError, ValueError)
    assert issubclass(DTypeError, TypeError)
    assert issubclass(StateError, RuntimeError)


# --- op construction --------------------------------------------------------------------


def test_add_shape_mismatch(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 5, 3), ctx.new_tensor_2d(ggopt.F32, 2, 3)
    _unchanged(ctx, lambda: ggopt.add(ctx, a, b), ShapeError, r"ggml_add.*\[2, 3, 1, 1\].*\[5, 3")
    _unchanged(ctx, lambda: ggopt.mul(ctx, b, a), ShapeError, "ggml_mul")


@pytest.mark.parametrize("a_ne, b_ne, match", [
    ((4, 3), (5, 2), r"a.ne\[0\]=4 must equal b.ne\[0\]=5"),
    ((4, 3, 2), (4, 2, 3), "broadcast"),
    ((4, 3, 1, 2), (4, 2, 1, 3), "broadcast"),
])
def test_mul_mat_shape_mismatch(ctx, a_ne, b_ne, match):
    a, b = ctx.new_tensor(ggopt.F32, a_ne), ctx.new_tensor(ggopt.F32, b_ne)
    _unchanged(ctx, lambda: ggopt.mul_mat(ctx, a, b), ShapeError, "ggml_mul_mat.*" + match)


def test_mul_mat_transposed_a(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 4, 4), ctx.new_tensor_2d(ggopt.F32, 4, 2)
    at = ggopt.transpose(ctx, a)
    _unchanged(ctx, lambda: ggopt.mul_mat(ctx, at, b), ShapeError, "transposed")


def test_mul_mat_empty_reduction_says_so(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 0, 3), ctx.new_tensor_2d(ggopt.F32, 0, 4)
    _unchanged(ctx, lambda: ggopt.mul_mat(ctx, a, b), ShapeError, "ne\\[0\\] = 0")


def test_cross_entropy_loss_shape_mismatch(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 10, 4), ctx.new_tensor_2d(ggopt.F32, 10, 5)
    _unchanged(ctx, lambda: ggopt.cross_entropy_loss(ctx, a, b), ShapeError,
               r"ggml_cross_entropy_loss.*\[10, 4, 1, 1\].*\[10, 5, 1, 1\]")


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


def test_conv_2d_direct_and_gradient_op_validation(ctx):
    x = ctx.new_tensor_4d(ggopt.F32, 6, 7, 2, 3)
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 2, 4)
    g = ctx.new_tensor_4d(ggopt.F32, 6, 7, 4, 3)   # the output of stride 1, padding 1
    prm = (1, 1, 1, 1, 1, 1)
    xi = ctx.new_tensor_4d(ggopt.I32, 6, 7, 2, 3)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, xi, *prm), DTypeError, "F32")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 0, 1, 1, 1, 1), ShapeError,
               "s1 must be >= 1")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 1, -1, 1, 1, 1), ShapeError,
               "p0 must be >= 0")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 1, 1, 1, 1, 2**31), ShapeError,
               "d1 must be < 2..31")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 1, 1, 1, 1.5, 1), DTypeError,
               "d0 must be an int")
    k3 = ctx.new_tensor_4d(ggopt.F32, 3, 3, 3, 4)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k3, x, *prm), ShapeError, "channels")
    k9 = ctx.new_tensor_4d(ggopt.F32, 9, 3, 2, 4)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k9, x, 1, 1, 0, 0, 1, 1), ShapeError,
               "empty output")
    wide = ctx.new_tensor_4d(ggopt.F32, 2**16, 2**15, 1, 1)   # 2**31 output positions
    k1 = ctx.new_tensor_4d(ggopt.F32, 1, 1, 1, 1)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k1, wide, 1, 1, 0, 0, 1, 1), ShapeError,
               "below 2..31")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_input(ctx, k, g, (6, 8, 2, 3), *prm), ShapeError,
               r"gradient \[6, 7, 4, 3\] must be \[6, 8, 4, 3\]")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_input(ctx, k, g, (6, 7, 3, 3), *prm), ShapeError,
               "channels")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_input(ctx, k, xi, (6, 7, 2, 3), *prm), DTypeError,
               "F32")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 2, 5), *prm), ShapeError,
               "must be")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 2, 4), 2, 1, 1, 1, 1, 1),
               ShapeError, "must be")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 5, 4), *prm), ShapeError,
               "channels")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(None, x, g, (3, 3, 2, 4), *prm),
               DTypeError, "Context")
    # consistent arguments build
    assert ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 2, 4), *prm).ne == k.ne
    assert ggopt.conv_2d_back_input(ctx, k, g, x.ne, *prm).ne == x.ne


def test_new_tensor_bad_shape_and_type(ctx):
    _unchanged(ctx, lambda: ctx.new_tensor_2d(ggopt.F32, 3, -1), ShapeError,
               r"ne\[1\] must be >= 0")
    _unchanged(ctx, lambda: ctx.new_tensor(ggopt.F32, (1, 2, 3, 4, 5)), ShapeError, "1 to 4")
    _unchanged(ctx, lambda: ctx.new_tensor_1d(99, 3), DTypeError, "unknown tensor type")


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


def test_opt_step_validation(ctx):
    w = ctx.new_tensor_1d(ggopt.F32, 4)
    grad, m, v = (ctx.new_tensor_1d(ggopt.F32, 4) for _ in range(3))
    prm7, prm2 = ctx.new_tensor_1d(ggopt.F32, 7), ctx.new_tensor_1d(ggopt.F32, 2)
    _unchanged(ctx, lambda: ggopt.opt_step_adamw(ctx, w, grad, m, v, prm7), ShapeError,
               "not a parameter")
    ggopt.set_param(w)
    short = ctx.new_tensor_1d(ggopt.F32, 3)
    _unchanged(ctx, lambda: ggopt.opt_step_adamw(ctx, w, grad, short, v, prm7), ShapeError,
               "m .* must have the parameter's shape")
    _unchanged(ctx, lambda: ggopt.opt_step_adamw(ctx, w, grad, m, v, prm2), ShapeError, "7 floats")
    _unchanged(ctx, lambda: ggopt.opt_step_sgd(ctx, w, grad, prm7), ShapeError, "2 floats")


# --- flags ------------------------------------------------------------------------------


def test_set_param_on_op_result(ctx):
    a = ctx.new_tensor_1d(ggopt.F32, 3)
    s = ggopt.sqr(ctx, a)
    before = observable_state(ctx)
    with pytest.raises(ShapeError, match="ggml_set_param.*op SQR"):
        ggopt.set_param(s)
    assert not s.is_param
    assert observable_state(ctx) == before


@pytest.mark.parametrize("make", [
    lambda c: c.new_tensor_1d(ggopt.F32, 2),
    lambda c: c.new_tensor_1d(ggopt.F16, 1),
    lambda c: c.new_tensor_2d(ggopt.F32, 1, 3),
])
def test_set_loss_on_non_scalar(ctx, make):
    t = make(ctx)
    before = observable_state(ctx)
    with pytest.raises(ShapeError, match="ggml_set_loss: the loss must be a scalar F32"):
        ggopt.set_loss(t)
    assert not t.has_flag(ggopt.TensorFlag.LOSS)
    assert observable_state(ctx) == before


# --- graphs -----------------------------------------------------------------------------


def _graph(ctx, param: bool = True, loss: bool = True, grads: bool = True):
    a = ctx.new_tensor_1d(ggopt.F32, 3)
    if param:
        ggopt.set_param(a)
    y = ggopt.sum(ctx, ggopt.sqr(ctx, a))
    if loss:
        ggopt.set_loss(y)
    gf = ggopt.new_graph_custom(ctx, 64, grads)
    ggopt.build_forward_expand(gf, y)
    return gf


@pytest.mark.parametrize("param, loss, grads, exc, match", [
    (False, True, True, ShapeError, "no parameter.*set_param"),
    (True, False, True, ShapeError, "no loss.*set_loss"),
    (True, True, False, StateError, "the graph has no gradient slots"),
])
def test_build_backward_expand_without_param_or_loss(ctx, param, loss, grads, exc, match):
    gf = _graph(ctx, param, loss, grads)
    before = observable_state(ctx, gf)
    with pytest.raises(exc, match="ggml_build_backward_expand: " + match):
        ggopt.build_backward_expand(ctx, gf, None)
    assert observable_state(ctx, gf) == before


def test_build_backward_expand_empty_graph(ctx):
    gf = ggopt.new_graph_custom(ctx, 8, True)
    before = observable_state(ctx, gf)
    with pytest.raises(ShapeError, match="no nodes"):
        ggopt.build_backward_expand(ctx, gf, None)
    assert observable_state(ctx, gf) == before


def test_build_backward_expand_short_grad_accs(ctx):
    gf = _graph(ctx)
    before = observable_state(ctx, gf)
    with pytest.raises(ShapeError, match="grad_accs has 1 entries"):
        ggopt.build_backward_expand(ctx, gf, [None])
    assert gf.n_nodes == 3
    assert observable_state(ctx, gf) == before


def _unsupported_backward_graph(ctx, kind: str):
    """A graph whose backward pass hits a rule that refuses its input (found while propagating)."""
    w = ctx.new_tensor_2d(ggopt.F32, 4, 3)
    ggopt.set_param(w)
    if kind == "labels":  # cross-entropy labels that depend on a parameter
        y = ggopt.cross_entropy_loss(ctx, ctx.new_tensor_2d(ggopt.F32, 4, 3), ggopt.sqr(ctx, w))
    elif kind == "get_rows_3d":  # get_rows gradients exist for 2-D sources only
        w3 = ctx.new_tensor_3d(ggopt.F32, 4, 3, 2)
        ggopt.set_param(w3)
        rows = ggopt.get_rows(ctx, w3, ctx.new_tensor_2d(ggopt.I32, 2, 2))
        y = ggopt.add(ctx, ggopt.sum(ctx, rows), ggopt.sum(ctx, ggopt.sqr(ctx, w)))
    else:  # a view of a non-contiguous tensor
        y = ggopt.sum(ctx, ggopt.view_1d(ctx, ggopt.transpose(ctx, w), 3, 0))
    ggopt.set_loss(y)
    gf = ggopt.new_graph_custom(ctx, 64, True)
    ggopt.build_forward_expand(gf, y)
    return gf


UNSUPPORTED_BACKWARD = {
    "labels": "ggml_cross_entropy_loss: gradients w.r.t. the labels",
    "get_rows_3d": "ggml_get_rows: gradients are supported for 2-D sources only",
    "view_of_transpose": "ggml_view: gradients of views of non-contiguous tensors",
}


@pytest.mark.parametrize("kind", list(UNSUPPORTED_BACKWARD))
def test_build_backward_expand_unsupported_rule_raises(ctx, kind):
    gf = _unsupported_backward_graph(ctx, kind)
    with pytest.raises(ShapeError, match=UNSUPPORTED_BACKWARD[kind]):
        ggopt.build_backward_expand(ctx, gf, None)


@pytest.mark.parametrize("kind", list(UNSUPPORTED_BACKWARD))
def test_build_backward_expand_unsupported_rule_changes_nothing(ctx, kind):
    gf = _unsupported_backward_graph(ctx, kind)
    before = observable_state(ctx, gf)
    with pytest.raises(ShapeError):
        ggopt.build_backward_expand(ctx, gf, None)
    assert gf.grads == {} and gf.grad_accs == {}
    assert observable_state(ctx, gf) == before


def test_graph_overflow(ctx):
    t = ctx.new_tensor_1d(ggopt.F32, 3)
    for _ in range(5):
        t = ggopt.sqr(ctx, t)
    gf = ggopt.new_graph_custom(ctx, 3, False)
    before = observable_state(ctx, gf)
    with pytest.raises(ShapeError, match="ggml_build_forward_expand: graph of size 3 is full"):
        ggopt.build_forward_expand(gf, t)
    assert gf.n_nodes == 0 and gf.n_leafs == 0 and not gf.visited
    assert observable_state(ctx, gf) == before
    with pytest.raises(ShapeError, match="positive"):
        ggopt.new_graph_custom(ctx, 0, False)
    assert observable_state(ctx, gf) == before


def test_graph_reset_errors(ctx):
    no_grads = _graph(ctx, grads=False)
    before = observable_state(ctx, no_grads)
    with pytest.raises(StateError, match="no gradient slots"):
        ggopt.graph_reset(no_grads)
    assert observable_state(ctx, no_grads) == before
    gf = _graph(ctx)
    ggopt.build_backward_expand(ctx, gf, None)
    before = observable_state(ctx, gf)
    with pytest.raises(StateError, match="ggml_graph_reset: .* has no memory"):
        ggopt.graph_reset(gf)
    assert observable_state(ctx, gf) == before
    ggopt.graph_reset(None)  # a no-op, as in ggml


# --- views and reshapes -----------------------------------------------------------------


def test_reshape_wrong_element_count(ctx):
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)
    _unchanged(ctx, lambda: ggopt.reshape_2d(ctx, a, 5, 3), ShapeError,
               r"ggml_reshape_2d: cannot reshape 12 elements .* \(15 elements\)")
    _unchanged(ctx, lambda: ggopt.reshape_1d(ctx, a, 11), ShapeError, "ggml_reshape_1d")
    like = ctx.new_tensor_1d(ggopt.F32, 4)
    _unchanged(ctx, lambda: ggopt.reshape(ctx, a, like), ShapeError, "ggml_reshape")


def test_reshape_non_contiguous(ctx):
    at = ggopt.transpose(ctx, ctx.new_tensor_2d(ggopt.F32, 4, 3))
    _unchanged(ctx, lambda: ggopt.reshape_1d(ctx, at, 12), ShapeError, "contiguous")


@pytest.mark.parametrize("make", [
    lambda c, a: ggopt.view_1d(c, a, 13, 0),
    lambda c, a: ggopt.view_1d(c, a, 4, 36),
    lambda c, a: ggopt.view_1d(c, a, 1, -4),
    lambda c, a: ggopt.view_2d(c, a, 4, 3, 20, 0),
    lambda c, a: ggopt.view_3d(c, a, 2, 2, 2, 16, 48, 0),
    lambda c, a: ggopt.view_4d(c, a, 1, 1, 1, 2, 4, 4, 48, 4),
], ids=["1d_too_long", "1d_offset", "negative_offset", "2d_stride", "3d", "4d"])
def test_view_out_of_bounds(ctx, make):
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)  # 48 bytes
    _unchanged(ctx, lambda: make(ctx, a), ShapeError, r"ggml_view_\dd: .* does not fit in the 48")


def test_view_of_view_out_of_bounds(ctx):
    a = ctx.new_tensor_1d(ggopt.F32, 10)
    v = ggopt.view_1d(ctx, a, 5, 16)  # elements 4..8
    ggopt.view_1d(ctx, v, 6, 0)  # elements 4..9: still inside a
    _unchanged(ctx, lambda: ggopt.view_1d(ctx, v, 7, 0), ShapeError, "does not fit")


# --- memory and data transfer -----------------------------------------------------------


def test_numpy_and_tensor_get_before_allocation(ctx):
    a = ctx.new_tensor_1d(ggopt.F32, 3)
    ggopt.set_name(a, "weights")
    before = observable_state(ctx)
    with pytest.raises(StateError, match="'weights' has no memory"):
        a.numpy()
    with pytest.raises(StateError, match="no memory"):
        gb.tensor_get(a)
    with pytest.raises(StateError, match="no memory"):
        gb.tensor_set(a, np.zeros(3, np.float32))
    with pytest.raises(StateError, match="no memory"):
        gb.tensor_fill(a, 0.0)
    assert observable_state(ctx) == before


def test_tensor_fill_writes_every_element_of_a_view_only(ctx):
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)
    row = ggopt.view_1d(ctx, a, 4, 4 * 4)  # the second row
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    gb.tensor_set(a, np.arange(12, dtype=np.float32))
    gb.tensor_fill(row, -2.5)
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    want[1] = -2.5
    np.testing.assert_array_equal(a.numpy(), want)
    with pytest.raises(DTypeError, match="Tensor"):
        gb.tensor_fill(want, 0.0)


def test_tensor_set_wrong_size_or_dtype(ctx):
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    gb.tensor_set(a, np.arange(12, dtype=np.float32).reshape(3, 4))
    before = observable_state(ctx)
    with pytest.raises(ShapeError, match="has 12 elements, the array 11"):
        gb.tensor_set(a, np.zeros(11, np.float32))
    with pytest.raises(DTypeError, match="is F32 .*the array is float64"):
        gb.tensor_set(a, np.zeros(12))
    with pytest.raises(DTypeError, match="int32"):
        gb.tensor_set(a, np.zeros(12, np.int32))
    assert observable_state(ctx) == before
    np.testing.assert_array_equal(a.numpy(), np.arange(12).reshape(3, 4))


def test_alloc_graph_twice_without_reset():
    ctx, cctx = ggopt.Context(), ggopt.Context()
    a = ctx.new_tensor_1d(ggopt.F32, 3)
    y = ggopt.sqr(cctx, a)
    ggopt.set_output(y)
    gf = ggopt.new_graph(cctx)
    ggopt.build_forward_expand(gf, y)
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(a, np.array([1, 2, 3], np.float32))
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    before = observable_state(ctx, cctx, gf, sched)
    with pytest.raises(StateError, match="alloc_graph: a graph is already allocated.*reset"):
        sched.alloc_graph(gf)
    assert observable_state(ctx, cctx, gf, sched) == before
    sched.graph_compute(gf)  # the first allocation is intact
    np.testing.assert_array_equal(y.numpy(), [1, 4, 9])
    sched.reset()
    assert y.buffer is None
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    np.testing.assert_array_equal(y.numpy(), [1, 4, 9])


@pytest.mark.parametrize("bad", [6, -1])
def test_get_rows_index_out_of_range_at_compute(bad):
    ctx, cctx = ggopt.Context(), ggopt.Context()
    a = ctx.new_tensor_2d(ggopt.F32, 5, 6)  # 6 rows
    idx = ctx.new_tensor_1d(ggopt.I32, 3)
    y = ggopt.get_rows(cctx, a, idx)
    ggopt.set_output(y)
    gf = ggopt.new_graph(cctx)
    ggopt.build_forward_expand(gf, y)
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(a, np.ones((6, 5), np.float32))
    gb.tensor_set(idx, np.array([0, bad, 2], np.int32))
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    y.numpy()[...] = -5  # the output must not be written
    before = observable_state(ctx, cctx, gf, sched)
    with pytest.raises(ShapeError, match="ggml_get_rows: row index out of range.*6 rows"):
        sched.graph_compute(gf)
    assert observable_state(ctx, cctx, gf, sched) == before
    gb.tensor_set(idx, np.array([0, 5, 2], np.int32))  # fixed indices compute fine
    sched.graph_compute(gf)
    np.testing.assert_array_equal(y.numpy(), 1.0)


def test_scheduler_and_backend_arguments():
    with pytest.raises(ShapeError, match="at least one backend"):
        gb.Scheduler([])
    with pytest.raises(DTypeError, match="Backend"):
        gb.Scheduler(["cpu"])
    cpu = gb.cpu_init()
    with pytest.raises(ShapeError, match="listed twice"):
        gb.Scheduler([cpu, cpu])
    with pytest.raises(InvalidValueError, match="n_threads"):
        gb.cpu_init(0)
    with pytest.raises(DTypeError, match="Graph"):
        gb.Scheduler([cpu]).alloc_graph(None)
