"""The direct convolution kernels (conv_2d, conv_2d_back_input, conv_2d_back_kernel) against
float64 NumPy references, the im2col formulation and PyTorch.

The kernels pick a block layout from the shapes (row blocks over a padded image when the width
stride is 1, position blocks otherwise; see ``_kernels/_conv2d_blocks.pxd``); the geometries
below exercise both, with one block and with several.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from ggopt._kernels import _conv, _conv2d
from tests.support.helpers import layout

# (N, IC, IH, IW, OC, KH, KW, s0, s1, p0, p1, d0, d1); index 0 acts on the width
GEOMETRIES = [
    (3, 2, 7, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1),      # rows, one block
    (2, 3, 6, 5, 5, 3, 3, 1, 1, 0, 0, 1, 1),      # rows, no padding
    (2, 3, 11, 8, 5, 2, 3, 2, 1, 0, 2, 1, 2),     # positions (s0 = 2)
    (1, 1, 5, 5, 2, 5, 4, 3, 2, 3, 1, 2, 1),      # positions, N = 1
    (2, 2, 9, 7, 3, 3, 2, 1, 2, 2, 1, 2, 1),      # rows, s1 = 2, dilated width
    (2, 1, 4, 9, 3, 1, 1, 1, 1, 0, 0, 1, 1),      # 1x1 kernel
    (2, 2, 6, 6, 3, 4, 6, 1, 1, 0, 0, 1, 1),      # positions (junk would be most of a row)
    (2, 48, 9, 30, 3, 3, 3, 1, 1, 1, 1, 1, 1),    # rows, several row blocks
    (2, 40, 15, 29, 3, 3, 3, 2, 1, 1, 1, 1, 1),   # positions, several blocks
    (2, 2, 4, 4, 3, 2, 2, 1000, 1000, 1000, 1000, 1, 1),  # far apart windows in padding
]
THREADS = [1, 2, 3]


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _taps(x_shape, KH, KW, s0, s1, p0, p1, d0, d1):
    """For every (oh, ow, kh, kw): the input row and column read, and whether inside."""
    _, _, IH, IW = x_shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    iy = np.arange(OH)[:, None] * s1 + np.arange(KH)[None, :] * d1 - p1   # (OH, KH)
    ix = np.arange(OW)[:, None] * s0 + np.arange(KW)[None, :] * d0 - p0   # (OW, KW)
    return iy, ix, (iy >= 0) & (iy < IH), (ix >= 0) & (ix < IW)


def patches_ref(x, KH, KW, *prm):
    """(N, IC, KH, KW, OH, OW) float64: what each tap reads, 0 in the padding."""
    iy, ix, in_y, in_x = _taps(x.shape, KH, KW, *prm)
    rows, cols = np.clip(iy, 0, x.shape[2] - 1), np.clip(ix, 0, x.shape[3] - 1)
    xi = x.astype(np.float64)[:, :, rows][..., cols]  # (N, IC, OH, KH, OW, KW)
    inside = in_y[:, :, None, None] & in_x[None, None, :, :]
    return np.where(inside, xi, 0.0).transpose(0, 1, 3, 5, 2, 4)


def conv_ref(k, x, *prm):
    P = patches_ref(x, k.shape[2], k.shape[3], *prm)
    return np.einsum("ocij,ncijhw->nohw", k.astype(np.float64), P)


def back_kernel_ref(x, gy, KH, KW, *prm):
    return np.einsum("nohw,ncijhw->ocij", gy.astype(np.float64),
                     patches_ref(x, KH, KW, *prm))


def back_input_ref(k, gy, x_shape, *prm):
    N, IC, IH, IW = x_shape
    KH, KW = k.shape[2], k.shape[3]
    iy, ix, in_y, in_x = _taps(x_shape, KH, KW, *prm)
    dP = np.einsum("ocij,nohw->ncijhw", k.astype(np.float64), gy.astype(np.float64))
    out = np.zeros((N, IC, IH, IW))
    for kh in range(KH):
        for kw in range(KW):
            for oh in np.nonzero(in_y[:, kh])[0]:
                cols = np.nonzero(in_x[:, kw])[0]
                np.add.at(out, (slice(None), slice(None), iy[oh, kh], ix[cols, kw]),
                          dP[:, :, kh, kw, oh, cols])
    return out


def _f32(rng, *shape):
    return rng.uniform(-1.0, 1.0, shape).astype(np.float32)


def _arrays(geometry, seed=0):
    N, IC, IH, IW, OC, KH, KW, *prm = geometry
    rng = np.random.default_rng(seed)
    OH, OW = _conv_out(IH, KH, prm[1], prm[3], prm[5]), _conv_out(IW, KW, prm[0], prm[2], prm[4])
    return _f32(rng, OC, IC, KH, KW), _f32(rng, N, IC, IH, IW), _f32(rng, N, OC, OH, OW), prm


def forward(k, x, prm, n_threads):
    OH = _conv_out(x.shape[2], k.shape[2], prm[1], prm[3], prm[5])
    OW = _conv_out(x.shape[3], k.shape[3], prm[0], prm[2], prm[4])
    y = np.full((x.shape[0], k.shape[0], OH, OW), np.nan, np.float32)
    _conv2d.conv_2d(k, x, y, *prm, n_threads)
    return y


def back_input(k, gy, x_shape, prm, n_threads):
    dx = np.full(x_shape, np.nan, np.float32)
    _conv2d.conv_2d_back_input(k, gy, dx, *prm, n_threads)
    return dx


def back_kernel(x, gy, k_shape, prm, n_threads):
    dk = np.full(k_shape, np.nan, np.float32)
    _conv2d.conv_2d_back_kernel(x, gy, dk, *prm, n_threads)
    return dk


@pytest.fixture(autouse=True)
def _serial_blas():
    """Outside a graph compute nothing holds BLAS on one thread: these direct calls do."""
    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_kernels_match_the_float64_reference(geometry):
    k, x, gy, prm = _arrays(geometry)
    np.testing.assert_allclose(forward(k, x, prm, 2), conv_ref(k, x, *prm), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back_input(k, gy, x.shape, prm, 2),
                               back_input_ref(k, gy, x.shape, *prm), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back_kernel(x, gy, k.shape, prm, 2),
                               back_kernel_ref(x, gy, k.shape[2], k.shape[3], *prm),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_results_do_not_depend_on_the_thread_count(geometry):
    k, x, gy, prm = _arrays(geometry, seed=1)
    runs = [(forward(k, x, prm, n), back_input(k, gy, x.shape, prm, n),
             back_kernel(x, gy, k.shape, prm, n)) for n in THREADS]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def test_mnist_shapes_do_not_depend_on_the_thread_count():
    """The MNIST-CNN's second layer, 37 images (the kernel gradient's 32 image groups)."""
    k, x, gy, prm = _arrays((37, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1, 1, 1), seed=2)
    runs = [(forward(k, x, prm, n), back_input(k, gy, x.shape, prm, n),
             back_kernel(x, gy, k.shape, prm, n)) for n in THREADS]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(runs[0][2], back_kernel_ref(x, gy, 3, 3, *prm), rtol=1e-4,
                               atol=1e-4)


def _layout(a: np.ndarray, kind: str) -> np.ndarray:
    """An array equal to ``a`` with the memory layout named by ``kind``: the image layouts
    (last two axes swapped, channels last), else ``helpers.layout``'s."""
    if kind == "transposed":
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if kind == "channels_last":
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return layout(a, kind)


@pytest.mark.parametrize("kind", ["strided", "transposed", "reversed", "channels_last",
                                  "readonly"])
@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[2]], ids=["rows", "positions"])
def test_inputs_may_have_any_strides(geometry, kind):
    k, x, gy, prm = _arrays(geometry, seed=3)
    want = (forward(k, x, prm, 2), back_input(k, gy, x.shape, prm, 2),
            back_kernel(x, gy, k.shape, prm, 2))
    kl, xl, gl = (_layout(a, kind) for a in (k, x, gy))
    got = (forward(kl, xl, prm, 2), back_input(kl, gl, x.shape, prm, 2),
           back_kernel(xl, gl, k.shape, prm, 2))
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_broadcast_output_gradient():
    """A gradient whose channels share memory (stride 0) is copied, not read as a matrix."""
    k, x, full, prm = _arrays(GEOMETRIES[2], seed=4)
    gy = np.broadcast_to(full[:, :1], full.shape)
    ref = np.ascontiguousarray(gy)
    np.testing.assert_allclose(back_input(k, gy, x.shape, prm, 2),
                               back_input(k, ref, x.shape, prm, 2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(back_kernel(x, gy, k.shape, prm, 2),
                               back_kernel(x, ref, k.shape, prm, 2), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[2], GEOMETRIES[7]], ids=str)
def test_equals_the_im2col_formulation(geometry):
    """ggml's conv_2d: im2col, a product with the kernel, the gradients through im2col_back."""
    k, x, gy, (s0, s1, p0, p1, d0, d1) = _arrays(geometry, seed=6)
    prm = (s0, s1, p0, p1, d0, d1)
    OC, IC, KH, KW = k.shape
    N, OH, OW = gy.shape[0], gy.shape[2], gy.shape[3]
    cols = np.empty((N, OH, OW, IC * KH * KW), np.float32)
    _conv.im2col(x, cols, KH, KW, *prm, 2)
    kmat = k.reshape(OC, -1)
    y = np.einsum("nhwk,ok->nohw", cols, kmat)
    dk = np.einsum("nhwk,nohw->ok", cols, gy).reshape(k.shape)
    dcols = np.ascontiguousarray(np.einsum("nohw,ok->nhwk", gy, kmat))
    dx = np.empty(x.shape, np.float32)
    _conv.im2col_back(dcols, dx, KH, KW, *prm, 2)
    np.testing.assert_allclose(forward(k, x, prm, 2), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back_input(k, gy, x.shape, prm, 2), dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back_kernel(x, gy, k.shape, prm, 2), dk, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[4], GEOMETRIES[2]], ids=str)
def test_matches_pytorch_and_its_autograd(geometry):
    torch = pytest.importorskip("torch")
    k, x, gy, (s0, s1, p0, p1, d0, d1) = _arrays(geometry, seed=7)
    prm = (s0, s1, p0, p1, d0, d1)
    tk = torch.tensor(k, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tk, stride=(s1, s0), padding=(p1, p0),
                                    dilation=(d1, d0))
    ty.backward(torch.tensor(gy))
    np.testing.assert_allclose(forward(k, x, prm, 2), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back_input(k, gy, x.shape, prm, 2), tx.grad.numpy(), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(back_kernel(x, gy, k.shape, prm, 2), tk.grad.numpy(), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("geometry, column", [(GEOMETRIES[0], -1), (GEOMETRIES[2], 3)],
                         ids=["rows", "positions"])
def test_infinities_reach_exactly_the_outputs_they_touch(geometry, column):
    """An infinite input pixel (kernel value) makes the kernel (input) gradient infinite where
    it is read and nowhere else: no 0 * inf from the row blocks' junk columns (with padding 1,
    a row block's junk columns read the image's last column, and the fold of tap kw = 0 adds
    them there)."""
    k, x, gy, prm = _arrays(geometry, seed=8)
    gy = np.abs(gy) + 0.5
    x[0, 0, 2, column] = np.inf
    with np.errstate(invalid="ignore"):
        want_dk = back_kernel_ref(x, gy, k.shape[2], k.shape[3], *prm)
    assert np.isinf(want_dk).any() and np.isfinite(want_dk).any()
    # assert_allclose also requires the infinities (and NaNs) at the same places
    np.testing.assert_allclose(back_kernel(x, gy, k.shape, prm, 2), want_dk, rtol=1e-5, atol=1e-5)
    k[0, 0, 1, 0] = np.inf
    with np.errstate(invalid="ignore"):
        want_dx = back_input_ref(k, gy, x.shape, *prm)
    assert np.isinf(want_dx).any() and np.isfinite(want_dx).any()
    np.testing.assert_allclose(back_input(k, gy, x.shape, prm, 2), want_dx, rtol=1e-5, atol=1e-5)


def test_a_nan_input_is_nan_in_the_output_it_reaches():
    k, x, _, prm = _arrays(GEOMETRIES[0], seed=9)
    x[1, 0, 3, 4] = np.nan
    y = forward(k, x, prm, 2)
    assert np.isnan(y[1, :, 2:5, 3:6]).all()
    assert np.isnan(y).sum() == k.shape[0] * 9 and not np.isnan(y[0]).any()


def test_empty_shapes():
    prm = (1, 1, 1, 1, 1, 1)
    k, x = np.ones((3, 2, 3, 3), np.float32), np.ones((0, 2, 5, 5), np.float32)
    assert forward(k, x, prm, 2).shape == (0, 3, 5, 5)
    # no input channels: the output is 0
    np.testing.assert_array_equal(forward(np.ones((3, 0, 3, 3), np.float32),
                                          np.ones((2, 0, 5, 5), np.float32), prm, 2), 0.0)
    # no output channels: the input gradient is 0
    np.testing.assert_array_equal(back_input(np.ones((0, 2, 3, 3), np.float32),
                                             np.ones((2, 0, 5, 5), np.float32), (2, 2, 5, 5),
                                             prm, 2), 0.0)
    # no images: the kernel gradient is 0
    np.testing.assert_array_equal(back_kernel(x, np.ones((0, 3, 5, 5), np.float32),
                                              (3, 2, 3, 3), prm, 2), 0.0)
    # a 0-pixel image padded to 2x2 outputs, all read from the padding
    y = forward(k, np.ones((1, 2, 0, 0), np.float32), (1, 1, 1, 1, 1, 1), 2)
    assert y.shape == (1, 3, 0, 0)
    y = forward(np.ones((3, 2, 1, 1), np.float32), np.ones((1, 2, 0, 0), np.float32),
                (1, 1, 1, 1, 1, 1), 2)
    np.testing.assert_array_equal(y, np.zeros((1, 3, 2, 2), np.float32))


def test_the_kernel_gradient_overwrites_dst():
    k, x, gy, prm = _arrays(GEOMETRIES[0], seed=10)
    dk = np.full(k.shape, 1e30, np.float32)
    _conv2d.conv_2d_back_kernel(x, gy, dk, *prm, 2)
    np.testing.assert_allclose(dk, back_kernel_ref(x, gy, 3, 3, *prm), rtol=1e-5, atol=1e-5)
