"""``ggopt.set_ggml_order``: the ops it accepts compute with the ggml-order kernels on the CPU
(the kernels' own tests: tests/kernels/test_ggml_order.py; a quantized weight's product:
tests/models/test_llama_quant.py), the same values as ggopt's order
to float rounding; every other op, and ``kv_padded`` where it means nothing, is refused before
anything changes."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt._kernels import _ggml_order as go
from ggopt.backend.plan_cache import graph_signature
from ggopt.errors import InvalidValueError
from ggopt.types import GGType
from tests.support.backend_cases import compute
from tests.support.ggml_order import mm_f32, softmax
from tests.support.helpers import new_tensor

f32 = np.float32
RNG = np.random.default_rng(0)
X = (RNG.standard_normal((2, 3, 5, 40)) * 3).astype(f32)
G = RNG.standard_normal((2, 3, 5, 40)).astype(f32)
MASK = np.where(RNG.random((1, 1, 5, 40)) < 0.3, -np.inf, 0).astype(f32)
MASK[..., 0] = 0



def _both(build, arrays):
    """The op's result in ggopt's order and in ggml's."""
    plain = compute(None, build, arrays)[0][0]
    ordered = compute(None, lambda c, *t: ggopt.set_ggml_order(build(c, *t)), arrays)[0][0]
    return plain, ordered


def _rows(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


def test_rms_norm_softmax_swiglu_take_the_kernels():
    plain, got = _both(lambda c, x: ggopt.rms_norm(c, x, 1e-5), [X])
    want = np.empty_like(_rows(X))
    go.rms_norm_rows(_rows(X), want, 1e-5, 1)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    np.testing.assert_allclose(got, plain, rtol=1e-6)

    plain, got = _both(lambda c, x, m: ggopt.soft_max_ext(c, x, m, 0.5, 0.0), [X, MASK])
    want = np.stack([np.stack([_softmax(X[i, j], MASK[0, 0]) for j in range(3)])
                     for i in range(2)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-7)

    plain, got = _both(lambda c, x, g: ggopt.swiglu_split(c, x, g), [X, G])
    want = np.empty_like(_rows(X))
    go.swiglu_rows(_rows(X), _rows(G), want, 1)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-7)


def _softmax(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    softmax(np.ascontiguousarray(x), mask, out, 0.5, 1)
    return out


def test_rope_and_products():
    x = RNG.standard_normal((1, 4, 3, 64)).astype(f32)  # [hd, heads, tokens]
    pos = np.arange(4, dtype=np.int32)

    def rope(c, t, p):
        return ggopt.rope_ext(c, t, p, None, 64, 0, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

    plain, got = _both(rope, [x, pos])
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(got, plain)  # fused: some pairs round otherwise

    a = RNG.standard_normal((1, 2, 7, 67)).astype(f32)
    b = RNG.standard_normal((1, 4, 5, 67)).astype(f32)  # a broadcast over dim 2
    plain, got = _both(ggopt.mul_mat, [a, b])
    got = got.reshape(1, 4, 5, 7)
    for i2 in range(4):  # b contiguous but K % 8 != 0: ggml_vec_dot_f32's order
        want = np.empty((5, 7), f32)
        mm_f32(a[0, i2 // 2], b[0, i2], want, False, 1)
        np.testing.assert_array_equal(got[0, i2], want)
    np.testing.assert_allclose(got, plain.reshape(got.shape), rtol=1e-5, atol=1e-5)



def test_kv_padded_softmax_and_product():
    x = RNG.standard_normal((1, 1, 3, 13)).astype(f32)
    _, got = _both(lambda c, t: ggopt.soft_max_ext(c, t, None, 1.0, 0.0), [x])
    padded = compute(None, lambda c, t: ggopt.set_ggml_order(
        ggopt.soft_max_ext(c, t, None, 1.0, 0.0), kv_padded=True), [x])[0][0]
    want = np.empty((3, 13), f32)
    softmax(x[0, 0], None, want, 1.0, 1, True)
    np.testing.assert_array_equal(padded.reshape(3, 13), want)
    np.testing.assert_allclose(padded, got, rtol=1e-6)
    a, b = (RNG.standard_normal((1, 1, n, 13)).astype(f32) for n in (4, 2))
    prod = compute(None, lambda c, p, q: ggopt.set_ggml_order(ggopt.mul_mat(c, p, q),
                                                              kv_padded=True), [a, b])[0][0]
    want = np.empty((2, 4), f32)
    mm_f32(a[0, 0], b[0, 0], want, True, 1)
    np.testing.assert_array_equal(prod.reshape(2, 4), want)


def test_other_ops_and_misplaced_kv_padded_are_refused():
    ctx = ggopt.Context()
    a, m = new_tensor(ctx, X), new_tensor(ctx, np.zeros((1, 1, 5, 40), f32))
    for t, what in ((ggopt.add(ctx, a, a), "op ADD"),
                    (ggopt.soft_max_ext(ctx, a, m, 1.0, 0.5), "ALiBi"),
                    (ggopt.swiglu(ctx, a), "one-source swiglu"),
                    (ggopt.mul_mat(ctx, ctx.new_tensor(GGType.F16, (256, 4)),
                                   ctx.new_tensor(ggopt.F32, (256, 2))), "F16 weight")):
        before = t.op_params
        with pytest.raises(InvalidValueError, match=what):
            ggopt.set_ggml_order(t)
        assert t.op_params == before and not ggopt.has_ggml_order(t)
    norm = ggopt.rms_norm(ctx, a, 1e-5)
    with pytest.raises(InvalidValueError, match="kv_padded"):
        ggopt.set_ggml_order(norm, kv_padded=True)
    assert not norm.op_params.ggml_order
    assert ggopt.set_ggml_order(norm) is norm and norm.op_params.ggml_order


def test_the_order_is_part_of_a_graph_s_signature():
    sigs = []
    for ordered in (False, True):
        ctx = ggopt.Context()
        t = ggopt.rms_norm(ctx, new_tensor(ctx, X), 1e-5)
        if ordered:
            ggopt.set_ggml_order(t)
        g = ggopt.new_graph_custom(ctx, 16, False)
        ggopt.build_forward_expand(g, t)
        sigs.append(graph_signature(g))
    assert sigs[0] is not None and sigs[1] is not None and sigs[0] != sigs[1]
