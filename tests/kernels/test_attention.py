"""ggopt._kernels._attention against float64 NumPy: masked/scaled/ALiBi softmax and causal masks."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _attention as A
from ggopt.errors import ShapeError
from tests.support.helpers import layout
from tests.support.tfm_ref import diag_mask_ref, soft_max_ext_ref

LAYOUTS = ["contiguous", "strided", "permuted", "padded_rows", "reversed", "readonly"]


def _causal(rows: int, cols: int, extra_rows: int = 0) -> np.ndarray:
    m = np.zeros((rows + extra_rows, cols), np.float32)
    m[np.triu_indices(rows + extra_rows, 1, cols)] = -np.inf
    return m


SHAPES = [
    ((2, 3, 5, 7), (1, 1, 6, 7)),          # one mask for every head, spare rows
    ((2, 6, 5, 7), (2, 3, 5, 7)),          # tiles heads by modulo
    ((1, 4, 130, 257), (1, 1, 130, 257)),  # enough work to start threads
]
# (shape, mask shape, scale, max_bias); ALiBi needs a mask
CASES = [((2, 3, 5, 7), None, s, 0.0) for s in (1.0, 0.3)] + [
    (sh, msh, s, mb) for sh, msh in SHAPES for s, mb in [(1.0, 0.0), (0.3, 0.0), (0.5, 8.0),
                                                         (1.0, 3.0)]]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape,mshape,scale,max_bias", CASES)
def test_soft_max_ext(rng, shape, mshape, scale, max_bias, n_threads):
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    mask = None
    if mshape is not None:
        mask = rng.uniform(-2, 2, mshape).astype(np.float32)
        mask[..., :, -1] = -np.inf  # a masked-out column
    want = soft_max_ext_ref(a, mask, scale, max_bias)
    for lay in LAYOUTS:
        dst = layout(np.zeros(shape, np.float32), "strided" if lay == "readonly" else "contiguous")
        m = None if mask is None else layout(mask, lay)
        A.soft_max_ext(layout(a, lay), m, dst, scale, max_bias, n_threads)
        np.testing.assert_allclose(dst, want, rtol=1e-5, atol=1e-7, err_msg=lay)


def test_causal_mask_and_in_place(rng):
    a = rng.standard_normal((1, 2, 4, 6)).astype(np.float32)
    mask = _causal(4, 6, extra_rows=2)[None, None]
    want = soft_max_ext_ref(a, mask, 0.5, 0.0)
    y = a.copy()
    A.soft_max_ext(y, mask, y, 0.5, 0.0, 1)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-8)
    assert (y[..., 0, 1:] == 0).all()


def test_thread_count_does_not_change_bits(rng):
    a = rng.standard_normal((2, 4, 128, 300)).astype(np.float32)
    mask = rng.uniform(-1, 1, (1, 2, 128, 300)).astype(np.float32)
    outs = []
    for nt in (1, 2):
        y = np.empty_like(a)
        A.soft_max_ext(a, mask, y, 0.7, 4.0, nt)
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_soft_max_ext_errors():
    a = np.zeros((2, 4, 5, 7), np.float32)
    d = np.zeros_like(a)
    for bad in [(1, 1, 4, 7), (1, 1, 5, 6), (1, 3, 5, 7), (3, 1, 5, 7)]:
        with pytest.raises(ShapeError, match="broadcast"):
            A.soft_max_ext(a, np.zeros(bad, np.float32), d, 1.0, 0.0, 1)
    with pytest.raises(ShapeError, match="ALiBi"):
        A.soft_max_ext(a, None, d, 1.0, 1.0, 1)
    with pytest.raises(ShapeError, match="dst"):
        A.soft_max_ext(a, None, d[..., :3], 1.0, 0.0, 1)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 2, 300, 301), (1, 1, 6, 3)])
@pytest.mark.parametrize("n_past", [0, 2, 10])
@pytest.mark.parametrize("value", [-np.inf, 0.0])
def test_diag_mask(rng, shape, n_past, value, n_threads):
    a = rng.standard_normal(shape).astype(np.float32)
    want = diag_mask_ref(a, n_past, value)
    for lay in LAYOUTS:
        dst = layout(np.full(shape, 5, np.float32), "padded_rows" if lay == "readonly"
                     else "contiguous")
        A.diag_mask(layout(a, lay), dst, n_past, value, n_threads)
        np.testing.assert_array_equal(dst, want.astype(np.float32), err_msg=lay)
    A.diag_mask(a, a, n_past, value, n_threads)  # in place
    np.testing.assert_array_equal(a, want.astype(np.float32))


def test_diag_mask_errors():
    a = np.zeros((1, 1, 3, 4), np.float32)
    with pytest.raises(ShapeError, match="n_past"):
        A.diag_mask(a, a.copy(), -1, 0.0, 1)
    with pytest.raises(ShapeError, match="dst"):
        A.diag_mask(a, np.zeros((1, 1, 3, 5), np.float32), 0, 0.0, 1)


def test_masked_tail_is_exact_zero_and_fully_masked_row_is_nan(rng):
    a = rng.standard_normal((1, 1, 3, 6)).astype(np.float32)
    mask = np.zeros((1, 1, 3, 6), np.float32)
    mask[0, 0, 0, 2:] = -np.inf  # a causal-style tail
    mask[0, 0, 1, ::2] = -np.inf  # holes, no tail
    mask[0, 0, 2, :] = -np.inf  # everything masked: NaN, as in ggml
    y = np.empty_like(a)
    A.soft_max_ext(a, mask, y, 1.0, 0.0, 1)
    assert (y[0, 0, 0, 2:] == 0).all() and (y[0, 0, 1, ::2] == 0).all()
    want = soft_max_ext_ref(a[:, :, :2], mask[:, :, :2], 1.0, 0.0)
    np.testing.assert_allclose(y[:, :, :2], want, rtol=1e-6)
    assert np.isnan(y[0, 0, 2]).all()
