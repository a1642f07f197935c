"""LoRA dropout (PEFT's ``lora_dropout``): p = 0 changes no bit, the masks drop about p of
the adapter's inputs with inverted scaling, the adapter's gradients follow the NumPy chain rule
for a given mask, the same bits on any thread count and static or dynamic, a bit-exact resume,
evaluation without dropout."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.errors import InvalidValueError
from ggopt.lm import lora
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.lm.lora_dropout import DropoutMasks
from ggopt.models import llama
from ggopt.opt.schedule import constant
from tests.support.finetune import CFG, tiny, windows


def _train(p: float | None, threads: int = 2, static: bool = True, epochs: int = 1,
           checkpoint=None, resume: bool = False):
    prev = ggopt.get_n_threads()
    ggopt.set_n_threads(threads)
    try:
        net = tiny()
        extra = {} if p is None else {"dropout": p}
        ad = lora.create(net, 4, 8.0, seed=3, **extra)
        lora.attach(net, ad)
        fp = FinetuneParams(n_batch=2, n_ubatch=1, lr=1e-2, val_split=0.1, static=static)
        ft = FineTuner(net, windows(9), fp, constant(fp.lr))
        ft.fit(epochs, checkpoint, resume)
        val = ft.validate().loss
        ft.close()
        return ad.arrays(), val
    finally:
        ggopt.set_n_threads(prev)


def _same(a, b) -> bool:
    return all(np.array_equal(a[k][i], b[k][i]) for k in a for i in (0, 1))


def test_p_zero_changes_no_bit():
    ref, val = _train(None)
    got, got_val = _train(0.0)
    assert _same(ref, got) and got_val == val
    net = tiny()
    lora.attach(net, lora.create(net, 2, 4.0, dropout=0.0))
    ft = FineTuner(net, windows(9), FinetuneParams(val_split=0.1))
    assert ft.dropout is None and "lora_dropout" not in ft._run_key()
    ft.close()


def test_masks_drop_about_p_with_inverted_scaling():
    net = tiny()
    ad = lora.create(net, 2, 4.0, dropout=0.25)
    masks = DropoutMasks(net, ad, 16 * 8, seed=7)
    drawn = masks.draw(3, 5)
    assert sorted(drawn) == sorted(ad.a)
    values = np.concatenate([m.ravel() for m in drawn.values()])
    assert set(np.unique(values)) == {np.float32(0.0), np.float32(1 / 0.75)}
    assert abs(np.mean(values == 0) - 0.25) < 0.01  # ~58k draws: 4.5 sigma
    again = masks.draw(3, 5)
    assert all(np.array_equal(drawn[k], again[k]) for k in drawn)  # keyed, not stateful
    other = masks.draw(3, 6)
    assert not all(np.array_equal(drawn[k], other[k]) for k in drawn)
    assert masks.nbytes() == 4 * 16 * 8 * sum(a.ne[0] for a in ad.a.values())


def test_adapter_gradients_match_numpy_for_a_given_mask():
    """y = W x + s B (A (m x)), L = sum(G * y): dL/dA = s (G B)^T (m x), dL/dB = s G^T (m x) A^T,
    and W x keeps the whole x."""
    net = tiny()
    ad = lora.create(net, 3, 6.0, ("attn_q",), seed=2, dropout=0.4)
    rng = np.random.default_rng(4)
    name = "blk.0.attn_q.weight"
    B = (rng.standard_normal((ad.b[name].ne[1], ad.b[name].ne[0])) * 0.3).astype(np.float32)
    gb.tensor_set(ad.b[name], B)
    N, n_in = 5, CFG.n_embd
    masks = DropoutMasks(net, ad, N, seed=1)
    masks.fill(2, 1)
    m = masks.draw(2, 1)[name]
    ictx, ctx = ggopt.Context(), ggopt.Context()
    x = ictx.new_tensor_2d(ggopt.F32, n_in, N)
    g_in = ictx.new_tensor_2d(ggopt.F32, CFG.n_embd, N)
    gb.alloc_ctx_tensors(ictx, net.sched.get_backend(0))
    w = net.params[name]
    y = masks.project(ctx, name, w, x)
    loss = ggopt.sum(ctx, ggopt.mul(ctx, y, g_in))
    ggopt.set_output(y)
    ggopt.set_output(loss)
    ggopt.set_loss(loss)
    gf = ggopt.new_graph_custom(ctx, 1024, True)
    ggopt.build_forward_expand(gf, loss)
    g = ggopt.graph_dup(ctx, gf)
    ggopt.build_backward_expand(ctx, g, None)
    grads = {t: ggopt.graph_get_grad(g, t) for t in (ad.a[name], ad.b[name])}
    for gt in grads.values():
        ggopt.set_output(gt)
    X = rng.standard_normal((N, n_in)).astype(np.float32)
    G = rng.standard_normal((N, CFG.n_embd)).astype(np.float32)
    gb.tensor_set(x, X)
    gb.tensor_set(g_in, G)
    net.sched.reset()
    net.sched.alloc_graph(g)
    ggopt.graph_reset(g)
    net.sched.graph_compute(g)
    A, s = ad.arrays()[name][0].astype(np.float64), ad.scale(name)
    W = gb.tensor_get(w).reshape(CFG.n_embd, n_in).astype(np.float64)
    Xm, G64, B64 = X.astype(np.float64) * m, G.astype(np.float64), B.astype(np.float64)
    want_y = X @ W.T + s * (Xm @ A.T) @ B64.T
    np.testing.assert_allclose(gb.tensor_get(y).reshape(N, -1), want_y, rtol=1e-4, atol=1e-5)
    dA = gb.tensor_get(grads[ad.a[name]]).reshape(A.shape)
    dB = gb.tensor_get(grads[ad.b[name]]).reshape(B.shape)
    np.testing.assert_allclose(dA, s * (G64 @ B64).T @ Xm, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dB, s * G64.T @ (Xm @ A.T), rtol=1e-4, atol=1e-5)
    assert np.any(m == 0) and not np.allclose(dA, s * (G64 @ B64).T @ X, rtol=1e-3)


def test_dropout_trains_otherwise_same_bits_on_threads_and_static_and_no_eval_dropout():
    plain, _ = _train(None)
    ref, val = _train(0.3)
    assert not _same(ref, plain)
    for threads, static in ((1, True), (3, True), (2, False)):
        got, got_val = _train(0.3, threads, static)
        assert _same(ref, got) and got_val == val
    # validation without dropout: the trained adapter's loss as a plain FineTuner computes it
    net = tiny()
    ad = lora.create(net, 4, 8.0, seed=3)
    lora.attach(net, ad)
    for n, (a, b) in ref.items():
        gb.tensor_set(ad.a[n], a)
        gb.tensor_set(ad.b[n], b)
    ft = FineTuner(net, windows(9), FinetuneParams(n_batch=2, n_ubatch=1, val_split=0.1))
    assert ft.validate().loss == val
    ft.close()


def test_resume_is_bit_exact(tmp_path):
    ref, _ = _train(0.3, epochs=2)
    ckpt = tmp_path / "state.gguf"
    _train(0.3, epochs=1, checkpoint=ckpt)
    got, _ = _train(0.3, epochs=2, checkpoint=ckpt, resume=True)
    assert _same(ref, got)
    # another dropout is another run: refused
    with pytest.raises(ggopt.GgoptError, match="lora_dropout"):
        _train(0.2, epochs=2, checkpoint=ckpt, resume=True)


@pytest.mark.parametrize("p", [-0.1, 1.0, float("nan"), "0.1", True])
def test_a_dropout_outside_0_1_is_refused(p):
    net = tiny()
    with pytest.raises(InvalidValueError, match=r"LoRA dropout must be a number in \[0, 1\)"):
        lora.create(net, 2, 4.0, dropout=p)
    assert llama.get_weights(net).keys() == llama.get_weights(tiny()).keys()


def test_the_session_api_checks_the_dropout_before_the_load(tmp_path, monkeypatch):
    from ggopt.lm import FineTune, session
    from tests.support.llama_files import write

    path = tmp_path / "base.gguf"
    write(path, llama.Config(n_ctx=32, n_embd=32, n_layer=1, n_head=4, n_head_kv=2, n_ff=64))
    ft = FineTune(path, 2, dropout=0.1, progress=False)
    assert ft.adapter is not None and ft.adapter.dropout == 0.1

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the dropout was checked")

    monkeypatch.setattr(session, "load", no_load)
    with pytest.raises(InvalidValueError, match=r"FineTune: the LoRA dropout must be"):
        FineTune(path, 2, dropout=1.0, progress=False)
    with pytest.raises(InvalidValueError, match="a LoRA dropout needs lora_rank"):
        FineTune(path, dropout=0.1, progress=False)
