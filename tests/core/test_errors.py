"""Bad input to the core (tensors, contexts, graph building) raises the right GgoptError subclass,
says what was wrong, and changes nothing (tests/support/state.py's assert_unchanged).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import DTypeError, ShapeError, StateError
from ggopt import backend as gb
from tests.support.state import assert_unchanged as _unchanged
from tests.support.state import observable_state


def test_error_classes_are_builtin_subclasses():
    assert issubclass(ShapeError, ValueError)
    assert issubclass(DTypeError, TypeError)
    assert issubclass(StateError, RuntimeError)


def test_new_tensor_bad_shape_and_type(ctx):
    _unchanged(ctx, lambda: ctx.new_tensor_2d(ggopt.F32, 3, -1), ShapeError,
               r"ne\[1\] must be >= 0")
    _unchanged(ctx, lambda: ctx.new_tensor(ggopt.F32, (1, 2, 3, 4, 5)), ShapeError, "1 to 4")
    _unchanged(ctx, lambda: ctx.new_tensor_1d(99, 3), DTypeError, "unknown tensor type")


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
