"""A small MLP and a small CNN (mnist-fc / mnist-cnn layouts, ggml-opt-spec §8.3) give
PyTorch's loss and gradients for the same weights and data."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt as g
from tests.support.helpers import GradProblem

torch = pytest.importorskip("torch", reason="PyTorch is needed for the parity tests")
F = torch.nn.functional

RTOL, ATOL = 1e-4, 1e-6


def _normal(rng: np.random.Generator, *shape: int, sd: float = 0.3) -> np.ndarray:
    return rng.normal(0.0, sd, shape).astype(np.float32)


def _compare(prob: GradProblem, loss_t, params_t) -> None:
    grads = prob.analytic()
    loss_t.backward()
    np.testing.assert_allclose(prob.loss.numpy().item(), loss_t.item(), rtol=RTOL)
    for i, (ours, p) in enumerate(zip(grads, params_t)):
        np.testing.assert_allclose(ours, p.grad.numpy(), rtol=RTOL, atol=ATOL,
                                   err_msg=f"gradient of parameter {i}")


def _torch(*arrays: np.ndarray):
    return [torch.tensor(a, requires_grad=True) for a in arrays]


@pytest.mark.parametrize("batch", [1, 7])
def test_mlp_matches_torch(batch):
    """h = relu(mul_mat(W1, x) + b1); logits = mul_mat(W2, h) + b2; cross_entropy_loss."""
    rng = np.random.default_rng(batch)
    n_in, n_hidden, n_out = 20, 16, 10
    w1, b1 = _normal(rng, n_hidden, n_in), _normal(rng, n_hidden)
    w2, b2 = _normal(rng, n_out, n_hidden), _normal(rng, n_out)
    x = rng.uniform(0, 1, (batch, n_in)).astype(np.float32)
    labels = rng.integers(0, n_out, batch)
    y = np.eye(n_out, dtype=np.float32)[labels]

    def build(c, tw1, tb1, tw2, tb2, tx, ty):
        h = g.relu(c, g.add(c, g.mul_mat(c, tw1, tx), tb1))
        logits = g.add(c, g.mul_mat(c, tw2, h), tb2)
        assert logits.ne == (n_out, batch, 1, 1)
        return g.cross_entropy_loss(c, logits, ty)

    prob = GradProblem(build, [w1, b1, w2, b2, x, y], params=(0, 1, 2, 3), weighted=False)
    params_t = _torch(w1, b1, w2, b2)
    tw1, tb1, tw2, tb2 = params_t
    h = F.relu(F.linear(torch.tensor(x), tw1, tb1))
    loss_t = F.cross_entropy(F.linear(h, tw2, tb2), torch.tensor(labels))
    _compare(prob, loss_t, params_t)


@pytest.mark.parametrize("batch", [1, 3])
def test_cnn_matches_torch(batch):
    """conv_2d + bias + relu + max-pool twice, NHWC flatten, dense, cross-entropy
    (ggml-opt-spec §8.3)."""
    rng = np.random.default_rng(10 + batch)
    side, c1, c2, n_out = 8, 4, 6, 10
    k1, kb1 = _normal(rng, c1, 1, 3, 3), _normal(rng, c1, 1, 1, sd=0.1)
    k2, kb2 = _normal(rng, c2, c1, 3, 3), _normal(rng, c2, 1, 1, sd=0.1)
    dense_in = (side // 4) ** 2 * c2
    dw, db = _normal(rng, n_out, dense_in), _normal(rng, n_out, sd=0.1)
    images = rng.uniform(0, 1, (batch, side * side)).astype(np.float32)
    labels = rng.integers(0, n_out, batch)
    y = np.eye(n_out, dtype=np.float32)[labels]

    def build(c, tk1, tkb1, tk2, tkb2, tdw, tdb, timg, ty):
        x = g.reshape_4d(c, timg, side, side, 1, batch)
        h = g.relu(c, g.add(c, g.conv_2d(c, tk1, x, 1, 1, 1, 1, 1, 1), tkb1))
        h = g.pool_2d(c, h, g.OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
        h = g.relu(c, g.add(c, g.conv_2d(c, tk2, h, 1, 1, 1, 1, 1, 1), tkb2))
        h = g.pool_2d(c, h, g.OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
        d = g.reshape_2d(c, g.cont(c, g.permute(c, h, 1, 2, 0, 3)), dense_in, batch)
        logits = g.add(c, g.mul_mat(c, tdw, d), tdb)
        assert logits.ne == (n_out, batch, 1, 1)
        return g.cross_entropy_loss(c, logits, ty)

    arrays = [k1, kb1, k2, kb2, dw, db, images, y]
    prob = GradProblem(build, arrays, params=range(6), weighted=False)
    params_t = _torch(k1, kb1, k2, kb2, dw, db)
    tk1, tkb1, tk2, tkb2, tdw, tdb = params_t
    x = torch.tensor(images).reshape(batch, 1, side, side)
    h = F.max_pool2d(F.relu(F.conv2d(x, tk1, tkb1.reshape(-1), padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, tk2, tkb2.reshape(-1), padding=1)), 2)
    d = h.permute(0, 2, 3, 1).reshape(batch, dense_in)  # NHWC flatten
    loss_t = F.cross_entropy(F.linear(d, tdw, tdb), torch.tensor(labels))
    _compare(prob, loss_t, params_t)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("n, wd", [(1000, 0.1), (100_003, 0.01), (257, 0.0)])
def test_adamw_kernel_matches_torch_adamw(n, wd, n_threads):
    """ggopt's AdamW kernel against torch.optim.AdamW over 10 steps: ggml's parameters are
    (alpha, beta1, beta2, eps, wd, 1/(1-beta1^t), 1/(1-beta2^t)); torch's lr is alpha."""
    from ggopt._kernels import _optim

    rng = np.random.default_rng(n)
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-8
    w = rng.standard_normal(n).astype(np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    p = torch.tensor(w.copy(), requires_grad=True)
    adamw = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                              foreach=False)
    for t in range(1, 11):
        g = rng.standard_normal(n).astype(np.float32)
        pars = np.array([lr, b1, b2, eps, wd, 1 / (1 - b1**t), 1 / (1 - b2**t)], np.float32)
        _optim.adamw_step(w, g, m, v, pars, n_threads)
        p.grad = torch.tensor(g)
        adamw.step()
    state = adamw.state[p]
    np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-5, atol=1e-7)
    # ggml forms 1 - beta2 in float32 (1 - 0.999f = 0.00099998713); torch in float64 (0.001)
    np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=3e-5, atol=1e-9)
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-5, atol=1e-6)
