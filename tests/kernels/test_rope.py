"""ggopt._kernels._rope against a float64 NumPy rope written from ggml's formula."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _rope as R
from ggopt.errors import ShapeError
from tests.support.helpers import layout
from tests.support.tfm_ref import rope_ref

DEFAULT = dict(n_ctx_orig=0, freq_base=10000.0, freq_scale=1.0, ext_factor=0.0,
               attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
YARN = dict(n_ctx_orig=64, freq_base=500.0, freq_scale=0.25, ext_factor=1.0, attn_factor=0.9,
            beta_fast=32.0, beta_slow=1.0)


def _call(x, pos, ff, dst, n_dims, neox, prm, sign, n_threads):
    R.rope(x, pos, ff, dst, n_dims, neox, prm["n_ctx_orig"], prm["freq_base"],
           prm["freq_scale"], prm["ext_factor"], prm["attn_factor"], prm["beta_fast"],
           prm["beta_slow"], sign, n_threads)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("shape,n_dims", [((2, 5, 3, 8), 8), ((1, 7, 2, 10), 6),
                                          ((2, 300, 4, 32), 32)])
@pytest.mark.parametrize("params", ["default", "yarn", "freq_factors"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["fwd", "back"])
def test_rope(rng, shape, n_dims, neox, params, sign, n_threads):
    x = rng.standard_normal(shape).astype(np.float32)
    pos = rng.integers(-3, 200, shape[1]).astype(np.int32)
    prm = YARN if params == "yarn" else DEFAULT
    ff = rng.uniform(0.5, 4.0, n_dims // 2 + 1).astype(np.float32) if params == "freq_factors" \
        else None
    kw = {k: prm[k] for k in ("freq_base", "freq_scale", "ext_factor", "attn_factor",
                              "beta_fast", "beta_slow", "n_ctx_orig")}
    want = rope_ref(x, pos, n_dims, neox, sign, freq_factors=ff, **kw)
    for lay in ["contiguous", "strided", "permuted", "reversed", "readonly"]:
        dst = layout(np.zeros(shape, np.float32), "padded_rows" if lay == "readonly"
                     else "contiguous")
        _call(layout(x, lay), layout(pos, "strided"), ff, dst, n_dims, neox, prm, sign, n_threads)
        # float32 angles of positions up to 200: a few ulp of 200 rad
        np.testing.assert_allclose(dst, want, rtol=1e-4, atol=1e-4, err_msg=lay)


def test_back_inverts_forward_and_thread_bits(rng):
    x = rng.standard_normal((2, 64, 4, 16)).astype(np.float32)
    pos = np.arange(64, dtype=np.int32)
    outs = []
    for nt in (1, 2):
        y, z = np.empty_like(x), np.empty_like(x)
        _call(x, pos, None, y, 16, False, DEFAULT, 1.0, nt)
        _call(y, pos, None, z, 16, False, DEFAULT, -1.0, nt)
        np.testing.assert_allclose(z, x, rtol=1e-5, atol=1e-5)
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_in_place(rng):
    x = rng.standard_normal((1, 4, 3, 6)).astype(np.float32)
    pos = np.arange(4, dtype=np.int32)
    want = rope_ref(x, pos, 6, True)
    y = x.copy()
    _call(y, pos, None, y, 6, True, DEFAULT, 1.0, 1)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_errors():
    x = np.zeros((1, 4, 3, 6), np.float32)
    pos = np.arange(4, dtype=np.int32)
    with pytest.raises(ShapeError, match="n_dims"):
        _call(x, pos, None, x.copy(), 5, False, DEFAULT, 1.0, 1)
    with pytest.raises(ShapeError, match="n_dims"):
        _call(x, pos, None, x.copy(), 8, False, DEFAULT, 1.0, 1)
    with pytest.raises(ShapeError, match="positions"):
        _call(x, pos[:3], None, x.copy(), 6, False, DEFAULT, 1.0, 1)
    with pytest.raises(ShapeError, match="frequency factors"):
        _call(x, pos, np.ones(2, np.float32), x.copy(), 6, False, DEFAULT, 1.0, 1)
    with pytest.raises(ShapeError, match="dst"):
        _call(x, pos, None, np.zeros((1, 4, 3, 7), np.float32), 6, False, DEFAULT, 1.0, 1)


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_position_tables_give_the_bits_of_per_token_tables(rng, neox):
    # positions repeated over sequences share one cos/sin table per position; a far position
    # (span longer than the tokens) makes every token build its own: the same bits either way
    T, B = 40, 3
    x = rng.standard_normal((1, T * B + 1, 4, 16)).astype(np.float32)
    pos = np.append(np.tile(np.arange(T, dtype=np.int32), B), np.int32(10**6))
    for n_threads in (1, 2):
        shared, own = np.empty_like(x[:, :-1]), np.empty_like(x)
        _call(x[:, :-1], pos[:-1], None, shared, 12, neox, YARN, 1.0, n_threads)
        _call(x, pos, None, own, 12, neox, YARN, 1.0, n_threads)
        assert shared.tobytes() == own[:, :-1].tobytes()
