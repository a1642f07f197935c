"""The transformer ops through graphs, against float64 NumPy references written from ggml's
definitions (tests/tfm_ref.py), on views and odd sizes, with 1 and 2 threads; and their input
validation (a GgoptError before anything changes)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import GradProblem, assert_close, run, run1
from tfm_ref import diag_mask_ref, rope_ref, soft_max_ext_ref

import ggopt
from ggopt import DTypeError, GgoptError, InvalidValueError, ShapeError

NORMAL, NEOX = ggopt.ROPE_TYPE_NORMAL, ggopt.ROPE_TYPE_NEOX


def f32(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def transposed(c, t):
    """A non-contiguous view holding the values of ``t`` transposed back."""
    return ggopt.transpose(c, ggopt.cont(c, ggopt.transpose(c, t)))


# --- forward against NumPy ----------------------------------------------------------------


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 130, 257)])
def test_rms_norm_and_norm(rng, shape):
    x = f32(rng, *shape) + np.float32(0.3)
    x64 = x.astype(np.float64)
    rms, nrm = run(lambda c, t: [ggopt.rms_norm(c, t, 1e-6), ggopt.norm(c, t, 1e-5)], x)
    assert_close(rms, x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6), rtol=1e-5)
    cen = x64 - x64.mean(-1, keepdims=True)
    assert_close(nrm, cen / np.sqrt((cen**2).mean(-1, keepdims=True) + 1e-5), rtol=1e-4,
                 atol=1e-5)


def test_norm_of_a_view(rng):
    x = f32(rng, 5, 6)
    got = run1(lambda c, t: ggopt.rms_norm(c, ggopt.transpose(c, t), 1e-5), x)
    xt = x.T.astype(np.float64)
    assert_close(got, xt / np.sqrt((xt**2).mean(-1, keepdims=True) + 1e-5), rtol=1e-5)


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("n_past", [0, 3])
def test_diag_masks(rng, n_past):
    x = f32(rng, 2, 5, 9)
    inf, zero = run(lambda c, t: [ggopt.diag_mask_inf(c, t, n_past),
                                  ggopt.diag_mask_zero(c, transposed(c, t), n_past)], x)
    np.testing.assert_array_equal(inf, diag_mask_ref(x, n_past, -np.inf).astype(np.float32))
    np.testing.assert_array_equal(zero, diag_mask_ref(x, n_past, 0.0).astype(np.float32))


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("a_shape,m_shape,scale,max_bias", [
    ((1, 4, 3, 5), None, 0.5, 0.0),
    ((1, 4, 3, 5), (1, 1, 4, 5), 0.5, 0.0),      # spare mask rows
    ((2, 4, 3, 5), (2, 2, 3, 5), 1.0, 0.0),      # tiled over heads and dim 3
    ((1, 5, 3, 5), (1, 1, 3, 5), 0.3, 8.0),      # ALiBi, 5 heads (not a power of two)
    ((2, 8, 130, 260), (1, 1, 130, 260), 0.125, 0.0),
])
def test_soft_max_ext(rng, a_shape, m_shape, scale, max_bias):
    a = f32(rng, *a_shape, lo=-5, hi=5)
    if m_shape is None:
        got = run1(lambda c, t: ggopt.soft_max_ext(c, t, None, scale, max_bias), a)
        mask = None
    else:
        mask = f32(rng, *m_shape)
        mask[..., 1::3] = -np.inf
        got = run1(lambda c, t, m: ggopt.soft_max_ext(c, t, m, scale, max_bias), a, mask)
    assert_close(got, soft_max_ext_ref(a, mask, scale, max_bias), rtol=1e-5, atol=1e-7)


def test_soft_max_ext_back(rng):
    g, y = f32(rng, 2, 3, 7), f32(rng, 2, 3, 7, lo=0, hi=1)
    got = run1(lambda c, a, b: ggopt.soft_max_ext_back(c, a, b, 0.4, 0.0), g, y)
    g64, y64 = g.astype(np.float64), y.astype(np.float64)
    assert_close(got, 0.4 * y64 * (g64 - (g64 * y64).sum(-1, keepdims=True)), rtol=1e-5)


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("mode", [NORMAL, NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("n_dims", [8, 4])
@pytest.mark.parametrize("yarn", [False, True], ids=["plain", "yarn"])
def test_rope_ext(rng, mode, n_dims, yarn):
    x = f32(rng, 2, 9, 3, 8)  # [head_dim 8, 3 heads, 9 tokens, 2]
    pos = rng.integers(0, 100, 9).astype(np.int32)
    ff = f32(rng, n_dims // 2, lo=0.5, hi=3.0)
    prm = (48, 1000.0, 0.5, 1.0, 0.9, 32.0, 1.0) if yarn else (0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    fwd, back = run(lambda c, t, p, f: [ggopt.rope_ext(c, t, p, f, n_dims, mode, *prm),
                                        ggopt.rope_ext_back(c, t, p, f, n_dims, mode, *prm)],
                    x, pos, ff)
    kw = dict(zip(("n_ctx_orig", "freq_base", "freq_scale", "ext_factor", "attn_factor",
                   "beta_fast", "beta_slow"), prm))
    neox = mode == NEOX
    assert_close(fwd, rope_ref(x, pos, n_dims, neox, 1.0, freq_factors=ff, **kw), 1e-4, 1e-5)
    assert_close(back, rope_ref(x, pos, n_dims, neox, -1.0, freq_factors=ff, **kw), 1e-4, 1e-5)


def test_rope_is_llama_normal_mode(rng):
    # ggopt.rope == rope_ext with ggml_rope's defaults; adjacent pairs rotate by p*10000^(-2i/d)
    x = f32(rng, 4, 2, 6)
    pos = np.array([0, 1, 5, 11], np.int32)
    got = run1(lambda c, t, p: ggopt.rope(c, t, p, 6, NORMAL), x, pos)
    theta = pos[:, None, None] * 10000.0 ** (-np.arange(3) / 3.0)
    x64 = x.astype(np.float64)
    want = np.empty_like(x64)
    want[..., 0::2] = x64[..., 0::2] * np.cos(theta) - x64[..., 1::2] * np.sin(theta)
    want[..., 1::2] = x64[..., 0::2] * np.sin(theta) + x64[..., 1::2] * np.cos(theta)
    assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("n_threads")
def test_swiglu_sin_cos_add1_concat(rng):
    a, b, s = f32(rng, 3, 4, 10, lo=-5, hi=5), f32(rng, 3, 4, 5), f32(rng, 1)
    outs = run(lambda c, x, y, z: [ggopt.swiglu(c, x), ggopt.swiglu_swapped(c, x),
                                   ggopt.swiglu_split(c, y, y),
                                   ggopt.sin(c, x), ggopt.cos(c, transposed(c, x)),
                                   ggopt.add1(c, y, z), ggopt.concat(c, x, y, 0),
                                   ggopt.concat(c, y, y, 2)], a, b, s)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)

    def silu(v):
        return v / (1 + np.exp(-v))

    assert_close(outs[0], silu(a64[..., :5]) * a64[..., 5:], rtol=2e-6)
    assert_close(outs[1], silu(a64[..., 5:]) * a64[..., :5], rtol=2e-6)
    assert_close(outs[2], silu(b64) * b64, rtol=2e-6)
    assert_close(outs[3], np.sin(a64), rtol=1e-6, atol=1e-6)
    assert_close(outs[4], np.cos(a64), rtol=1e-6, atol=1e-6)
    assert_close(outs[5], b64 + s[0], rtol=1e-7)
    assert_close(outs[6], np.concatenate([a64, b64], axis=-1), rtol=0, atol=0)
    assert_close(outs[7], np.concatenate([b64, b64], axis=0), rtol=0, atol=0)


def test_silu_back(rng):
    g, x = f32(rng, 3, 5), f32(rng, 3, 5, lo=-4, hi=4)
    got = run1(ggopt.silu_back, g, x)
    x64 = x.astype(np.float64)
    sig = 1 / (1 + np.exp(-x64))
    assert_close(got, g * sig * (1 + x64 * (1 - sig)), rtol=1e-5, atol=1e-7)


@pytest.mark.usefixtures("n_threads")
def test_grouped_query_attention_is_one_mul_mat(rng):
    # 6 query heads over 2 KV heads: query head h uses KV head h // 3 (ggml's dim-2 broadcast)
    k, q = f32(rng, 2, 5, 4), f32(rng, 6, 7, 4)  # [d, n_kv, n_head_kv], [d, n_tok, n_head]
    kq = run1(ggopt.mul_mat, k, q)
    want = np.stack([q[h] @ k[h // 3].T for h in range(6)])
    assert_close(kq, want, rtol=1e-5, atol=1e-6)


# --- backward rules -------------------------------------------------------------------------


def test_mask_and_freq_factors_get_no_gradient(rng):
    def masked(c, a, m):
        return ggopt.soft_max_ext(c, a, m, 1.0, 0.0)

    with pytest.raises(ShapeError, match="mask gets no gradient"):
        GradProblem(masked, [f32(rng, 3, 4), f32(rng, 3, 4)], params=(0, 1))

    def roped(c, a, p, f):
        return ggopt.rope_ext(c, a, p, f, 4, NORMAL, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)

    with pytest.raises(ShapeError, match="frequency factors get no gradient"):
        GradProblem(roped, [f32(rng, 2, 1, 4), np.arange(2, dtype=np.int32), f32(rng, 2)],
                    params=(0, 2))


def test_add1_gradient_of_b_is_the_sum(rng):
    # ggml takes the mean here; ggopt the true gradient
    prob = GradProblem(ggopt.add1, [f32(rng, 3, 4), np.array([0.5], np.float32)], params=(1,))
    (grad_b,) = prob.analytic()  # loss = sum(add1(a, b) * w): d/db = sum(w)
    np.testing.assert_allclose(grad_b, [prob.arrays[-1].sum()], rtol=1e-6)


# --- input validation -----------------------------------------------------------------------


@pytest.fixture
def ctx() -> ggopt.Context:
    return ggopt.Context()


def _unchanged(ctx: ggopt.Context, fn, exc, match: str) -> None:
    n = len(ctx)
    with pytest.raises(exc, match=match) as info:
        fn()
    assert isinstance(info.value, GgoptError)
    assert len(ctx) == n


def test_rope_validation(ctx):
    a = ctx.new_tensor_3d(ggopt.F32, 8, 2, 5)
    pos, fpos = ctx.new_tensor_1d(ggopt.I32, 5), ctx.new_tensor_1d(ggopt.F32, 5)
    ff = ctx.new_tensor_1d(ggopt.F32, 2)

    def rope_ext(p, c, n_dims, mode):
        return lambda: ggopt.rope_ext(ctx, a, p, c, n_dims, mode, 0, 1e4, 1.0, 0.0, 1.0, 0.0, 0.0)

    _unchanged(ctx, rope_ext(fpos, None, 8, NORMAL), DTypeError, "positions.*must be I32")
    _unchanged(ctx, rope_ext(pos, None, 7, NORMAL), ShapeError, "n_dims must be even")
    _unchanged(ctx, rope_ext(pos, None, 10, NORMAL), ShapeError, "n_dims must be even")
    _unchanged(ctx, rope_ext(pos, None, 8, 1), InvalidValueError, "mode")
    _unchanged(ctx, rope_ext(ctx.new_tensor_1d(ggopt.I32, 4), None, 8, NORMAL), ShapeError,
               "one per token")
    _unchanged(ctx, rope_ext(pos, ff, 8, NEOX), ShapeError, "frequency factors")
    _unchanged(ctx, rope_ext(pos, pos, 4, NEOX), DTypeError, "frequency factors.*F32")
    _unchanged(ctx, lambda: ggopt.rope(ctx, a, pos, 8.0, NORMAL), DTypeError, "n_dims")


def test_soft_max_ext_validation(ctx):
    a = ctx.new_tensor_4d(ggopt.F32, 6, 4, 6, 2)
    imask = ctx.new_tensor_2d(ggopt.I32, 6, 4)

    def sm(m, scale=1.0, max_bias=0.0):
        return lambda: ggopt.soft_max_ext(ctx, a, m, scale, max_bias)

    _unchanged(ctx, sm(imask), DTypeError, "mask must be F32")
    for ne in [(5, 4), (6, 3), (6, 4, 4), (6, 4, 2, 3)]:
        _unchanged(ctx, sm(ctx.new_tensor(ggopt.F32, ne)), ShapeError, "does not broadcast")
    _unchanged(ctx, sm(None, max_bias=1.0), ShapeError, "ALiBi")
    _unchanged(ctx, sm(ctx.new_tensor_2d(ggopt.F32, 6, 4), scale="x"), DTypeError, "scale")
    g = ctx.new_tensor_2d(ggopt.F32, 6, 4)
    _unchanged(ctx, lambda: ggopt.soft_max_ext_back(ctx, g, a, 1.0, 0.0), ShapeError, "one shape")


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
