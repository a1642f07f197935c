"""Transformer kernels and one llama decoder block, forward + backward, beside PyTorch.

Each group runs PyTorch first and ggopt last; the ggopt row stores ``ratio_vs_torch`` (above 1
is faster) and the issue's target. Sizes are ``[n_embd=256, n_tokens=1024]`` (262,144 floats)
for the kernels and a 256-token block with 256 embedding dims for the decoder. Run with
``pytest bench/bench_transformer.py`` (see bench/README.md).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import ggopt
from ggopt._kernels import _attention as _attn
from ggopt._kernels import _norm, _rope, _softmax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
from tools.llama_block import Config, GgoptBlock, init_weights, torch_block_loss  # noqa: E402

pytestmark = pytest.mark.usefixtures("bench_threads")

FAST = {"warmup": True, "warmup_iterations": 20}
N_EMBD, N_TOKENS, HEAD_DIM, EPS = 256, 1024, 64, 1e-5


def _torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(ggopt.get_n_threads())
    return torch


def _normal(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _torch_step(fn, x: np.ndarray, g: np.ndarray):
    """A step running ``fn(x)`` forward and backward with output gradient ``g``; returns
    (step, output, input gradient) as NumPy views of torch's tensors after a step."""
    torch = _torch()
    tx = torch.tensor(x, requires_grad=True)
    tg = torch.tensor(g)
    out = {}

    def step() -> None:
        tx.grad = None
        y = fn(tx)
        y.backward(tg)
        out["y"], out["dx"] = y.detach(), tx.grad

    return step, out


def assert_matches(got_y, got_dx, want_y, want_dx, atol=1e-5):
    np.testing.assert_allclose(got_y, want_y, rtol=1e-4, atol=atol)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-4, atol=atol)


# --- rms_norm -------------------------------------------------------------------------------


@pytest.mark.benchmark(group="rms_norm fwd+bwd [256x1024]", **FAST)
@pytest.mark.parametrize("impl", ["torch", "ggopt"])
def test_rms_norm(benchmark, ratio_to, impl):
    x, g = _normal(1, 1, N_TOKENS, N_EMBD, seed=1), _normal(1, 1, N_TOKENS, N_EMBD, seed=2)
    torch = _torch()
    ref_step, ref = _torch_step(
        lambda t: torch.nn.functional.rms_norm(t, (N_EMBD,), eps=EPS), x, g)
    ref_step()
    if impl == "torch":
        benchmark(ref_step)
        ratio_to(impl)
        return
    y, dx, n = np.empty_like(x), np.empty_like(x), ggopt.get_n_threads()

    def step() -> None:
        _norm.rms_norm(x, y, EPS, n)
        _norm.rms_norm_back(g, x, dx, EPS, n)

    benchmark(step)
    assert_matches(y, dx, ref["y"].numpy(), ref["dx"].numpy())
    ratio_to(impl, torch=1.0)


# --- rope -----------------------------------------------------------------------------------


def _torch_rope(torch, x, cos, sin):
    """llama's NORMAL rope on (T, heads, hd) with a precomputed cos/sin cache."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


@pytest.mark.benchmark(group="rope fwd+bwd [64x4x1024]", **FAST)
@pytest.mark.parametrize("impl", ["torch", "ggopt"])
def test_rope(benchmark, ratio_to, impl):
    n_head = N_EMBD // HEAD_DIM
    x = _normal(1, N_TOKENS, n_head, HEAD_DIM, seed=3)
    g = _normal(1, N_TOKENS, n_head, HEAD_DIM, seed=4)
    pos = np.arange(N_TOKENS, dtype=np.int32)
    torch = _torch()
    theta = torch.arange(N_TOKENS, dtype=torch.float32)[:, None] * 10000.0 ** (
        -torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    cos, sin = torch.cos(theta)[:, None, :], torch.sin(theta)[:, None, :]
    ref_step, ref = _torch_step(lambda t: _torch_rope(torch, t, cos, sin), x, g)
    ref_step()
    if impl == "torch":
        benchmark(ref_step)
        ratio_to(impl)
        return
    y, dx, n = np.empty_like(x), np.empty_like(x), ggopt.get_n_threads()
    prm = (HEAD_DIM, False, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

    def step() -> None:
        _rope.rope(x, pos, None, y, *prm, 1.0, n)
        _rope.rope(g, pos, None, dx, *prm, -1.0, n)

    benchmark(step)
    assert_matches(y, dx, ref["y"].numpy(), ref["dx"].numpy(), atol=2e-4)
    ratio_to(impl, torch=1.0)


# --- masked, scaled softmax -----------------------------------------------------------------


@pytest.mark.benchmark(group="soft_max_ext causal fwd+bwd [256x256x4]", **FAST)
@pytest.mark.parametrize("impl", ["torch", "ggopt"])
def test_masked_soft_max(benchmark, ratio_to, impl):
    n_head, n_kv = 4, N_EMBD  # 4 heads of 256x256 scores: 262,144 floats
    a, g = _normal(1, n_head, n_kv, n_kv, seed=5), _normal(1, n_head, n_kv, n_kv, seed=6)
    mask = np.triu(np.full((n_kv, n_kv), -np.inf, np.float32), 1)[None, None]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    torch = _torch()
    tm = torch.tensor(mask)
    ref_step, ref = _torch_step(lambda t: torch.softmax(t * scale + tm, dim=-1), a, g)
    ref_step()
    if impl == "torch":
        benchmark(ref_step)
        ratio_to(impl)
        return
    y, dx, n = np.empty_like(a), np.empty_like(a), ggopt.get_n_threads()

    def step() -> None:
        _attn.soft_max_ext(a, mask, y, scale, 0.0, n)
        _softmax.soft_max_back(g, y, dx, scale, n)

    benchmark(step)
    assert_matches(y, dx, ref["y"].numpy(), ref["dx"].numpy())
    ratio_to(impl, torch=1.0)


# --- one llama decoder block ----------------------------------------------------------------

BLOCK = Config(n_vocab=256, n_embd=256, n_head=4, n_head_kv=2, n_ff=688, n_tokens=256)


@pytest.mark.benchmark(group="llama block fwd+bwd [256 embd, 256 tokens, GQA 4/2]",
                       warmup=True, warmup_iterations=3)
@pytest.mark.parametrize("impl", ["torch", "ggopt"])
def test_decoder_block(benchmark, ratio_to, impl):
    w = init_weights(BLOCK, seed=7)
    rng = np.random.default_rng(8)
    tokens = rng.integers(0, BLOCK.n_vocab, BLOCK.n_tokens)
    labels = rng.integers(0, BLOCK.n_vocab, BLOCK.n_tokens)
    torch = _torch()
    tw = {k: torch.tensor(v, requires_grad=True) for k, v in w.items()}
    tt, tl = torch.tensor(tokens), torch.tensor(labels)
    out = {}

    def torch_step() -> None:
        for t in tw.values():
            t.grad = None
        loss = torch_block_loss(BLOCK, tw, tt, tl)
        loss.backward()
        out["loss"] = loss.item()

    torch_step()
    if impl == "torch":
        benchmark(torch_step)
        ratio_to(impl)
        return
    block = GgoptBlock(BLOCK, w, tokens, labels)
    benchmark(block.step)
    loss, grads = block.loss_and_grads()
    np.testing.assert_allclose(loss, out["loss"], rtol=1e-4)
    np.testing.assert_allclose(grads["wq"], tw["wq"].grad.numpy(), rtol=1e-3, atol=1e-5)
    ratio_to(impl, torch=1.0)
