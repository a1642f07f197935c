"""A llama decoder block built from the transformer ops gives PyTorch's loss and parameter
gradients (float64 reference, rope per ggml's formula) with 1 and 2 threads, for one head,
four heads, and grouped-query attention."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from tools.llama_block import WEIGHTS, Config, GgoptBlock, init_weights, torch_block_loss

torch = pytest.importorskip("torch")

@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("n_head,n_head_kv", [(1, 1), (4, 4), (4, 2), (4, 1)],
                         ids=["1head", "4heads", "gqa4x2", "mqa4x1"])
def test_block_matches_torch(n_head, n_head_kv):
    cfg = Config(n_head=n_head, n_head_kv=n_head_kv)
    w = init_weights(cfg, seed=n_head + 10 * n_head_kv)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, cfg.n_vocab, cfg.n_tokens)
    labels = rng.integers(0, cfg.n_vocab, cfg.n_tokens)

    loss, grads = GgoptBlock(cfg, w, tokens, labels).loss_and_grads()

    tw = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in w.items()}
    ref = torch_block_loss(cfg, tw, torch.tensor(tokens), torch.tensor(labels))
    ref.backward()
    np.testing.assert_allclose(loss, ref.item(), rtol=1e-4)
    for k in WEIGHTS:
        want = tw[k].grad.numpy()
        np.testing.assert_allclose(grads[k], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(),
                                   err_msg=k)


def test_block_results_do_not_depend_on_thread_count():
    cfg = Config(n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_tokens=40)
    w = init_weights(cfg, seed=5)
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, cfg.n_vocab, cfg.n_tokens)
    labels = rng.integers(0, cfg.n_vocab, cfg.n_tokens)
    block = GgoptBlock(cfg, w, tokens, labels)
    runs = []
    try:
        for n in (1, 2):
            ggopt.set_n_threads(n)
            runs.append(block.loss_and_grads())
    finally:
        ggopt.set_n_threads(None)
    assert runs[0][0] == runs[1][0]
    for k in WEIGHTS:
        np.testing.assert_array_equal(runs[0][1][k], runs[1][1][k], err_msg=k)
