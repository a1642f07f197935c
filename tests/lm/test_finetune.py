"""Fine-tuning: llama.cpp's windows, the masked loss against PyTorch's ignore_index,
tied-output gradients, thread independence, static == dynamic graphs, bit-exact resume."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.errors import InvalidValueError, ShapeError
from ggopt.lm.finetune import FinetuneParams, FineTuner, _LossInputs
from ggopt.lm.windows import MASKED, split_point, text_windows
from ggopt.models import llama
from ggopt.opt.schedule import epoch_decay, warmup_cosine
from tests.support.finetune import CFG, loss_and_grads, tiny, windows
from tests.support.helpers import square_graph


def test_windows_as_llama_cpp():
    ids = list(range(1000))
    w = text_windows(ids, 64)
    assert len(w) == (1000 - 64 - 1) // 32
    assert (w.tokens[3] == np.arange(96, 160)).all()
    assert (w.labels == w.tokens + 1).all()
    assert split_point(100, 0.05) == 95


def test_short_text_says_how_many_tokens():
    with pytest.raises(ShapeError, match=r"has 100 tokens.*needs at least 385"):
        text_windows(list(range(100)), 256)


def _ce_graph(logits: np.ndarray, labels: np.ndarray, weight: float):
    """ggopt's fine-tune loss on a logits PARAM: (loss, d loss / d logits)."""
    n, V = logits.shape

    class _Net:  # what _LossInputs needs of a model
        cfg = llama.Config(n_vocab=V)
        sched = gb.Scheduler([gb.cpu_init()])

    loss_in = _LossInputs(_Net(), n)  # type: ignore[arg-type]
    ctx = ggopt.Context()
    x = ctx.new_tensor_2d(ggopt.F32, V, n)
    ggopt.set_param(x)
    gb.alloc_ctx_tensors(ctx, _Net.sched.get_backend(0))
    gb.tensor_set(x, logits)
    cctx = ggopt.Context()
    loss = loss_in.loss(cctx, x)
    ggopt.set_output(loss)
    ggopt.set_loss(loss)
    gf = ggopt.new_graph_custom(cctx, 64, True)
    ggopt.build_forward_expand(gf, loss)
    g = ggopt.graph_dup(cctx, gf)
    ggopt.build_backward_expand(cctx, g, None)
    grad = ggopt.graph_get_grad(g, x)
    ggopt.set_output(grad)
    loss_in.set(labels, weight)
    _Net.sched.alloc_graph(g)
    ggopt.graph_reset(g)
    _Net.sched.graph_compute(g)
    return float(gb.tensor_get(loss)[0]), gb.tensor_get(grad).reshape(n, V)


def test_masked_loss_equals_torch_ignore_index():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    n, V = 24, 50
    logits = (rng.standard_normal((n, V)) * 3).astype(np.float32)
    labels = rng.integers(0, V, n).astype(np.int32)
    labels[[1, 4, 5, 11, 20]] = MASKED
    n_trained = int((labels != MASKED).sum())
    loss, grad = _ce_graph(logits, labels, float(np.float32(n) / np.float32(n_trained)))
    t = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(t, torch.tensor(labels, dtype=torch.long),
                                            ignore_index=MASKED)
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-6)
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert (grad[labels == MASKED] == 0).all()  # exactly zero, not small


def test_masked_tokens_change_no_gradient():
    net = tiny()
    w = windows(2, masked=True)
    _, g1 = loss_and_grads(net, w.tokens, w.labels)
    # what a masked position would have predicted: any other target, the same gradients
    tokens = w.tokens.copy()
    tokens[:, -1] = (tokens[:, -1] + 7) % CFG.n_vocab  # the last input predicts only a label
    labels = w.labels.copy()
    labels[:, -1] = MASKED
    _, g2 = loss_and_grads(net, w.tokens, labels)
    _, g3 = loss_and_grads(net, tokens, labels)
    for k in g2:
        assert np.array_equal(g2[k], g3[k]), k
    assert any(not np.array_equal(g1[k], g2[k]) for k in g1)


@pytest.mark.parametrize("masked", [False, True])
def test_the_loss_on_ids_equals_the_one_hot_loss(masked):
    """The cross-entropy on label ids gives the loss and every gradient of the one-hot
    formulation it replaced (``w * cross_entropy_loss(logits * m, one_hot)``), exactly."""
    net = tiny()
    w = windows(2, masked=masked)
    loss, grads = loss_and_grads(net, w.tokens, w.labels, 0.75)
    want_loss, want = loss_and_grads(net, w.tokens, w.labels, 0.75, one_hot=True)
    assert loss == want_loss
    assert grads.keys() == want.keys() and grads
    for k in grads:
        np.testing.assert_array_equal(grads[k], want[k], err_msg=k)


@pytest.mark.parametrize("field,bad", [("labels", 64), ("labels", -5), ("tokens", 64),
                                       ("tokens", MASKED)])
def test_ids_outside_the_vocabulary_are_refused_before_anything_is_built(field, bad):
    """Regression: a label >= n_vocab was a raw IndexError at the first step, a negative one
    other than MASKED trained silently on the wrong one-hot row."""
    net = tiny()
    w = windows(4)
    getattr(w, field)[2, 5] = bad
    with pytest.raises(InvalidValueError, match=rf"{field[:-1]} {bad} at position 5 of window "
                                                r"2 is outside.*64 tokens"):
        FineTuner(net, w, FinetuneParams(val_split=0.0))
    assert net.sched.held_buffer_bytes() == 0


def test_tied_output_gets_both_gradients():
    """A tied token_embd's gradient = the untied model's token_embd + output gradients."""
    untied_cfg = llama.Config(**{**CFG.__dict__, "tied_output": False})
    tied = tiny()
    untied = llama.build_model(untied_cfg, gb.Scheduler([gb.cpu_init()]))
    wt = llama.get_weights(tied)
    llama.set_weights(untied, {**wt, "output.weight": wt["token_embd.weight"]}, "untied")
    w = windows(1)
    _, gt = loss_and_grads(tied, w.tokens, w.labels)
    _, gu = loss_and_grads(untied, w.tokens, w.labels)
    np.testing.assert_allclose(gt["token_embd.weight"],
                               gu["token_embd.weight"] + gu["output.weight"],
                               rtol=1e-5, atol=1e-8)
    assert len(gt) == len(llama.param_shapes(CFG))  # every weight trains, token_embd included


def _train(static: bool = False, threads: int = 2, masked: bool = False, epochs: int = 1,
           checkpoint=None, resume: bool = False) -> dict[str, np.ndarray]:
    prev = ggopt.get_n_threads()
    ggopt.set_n_threads(threads)
    try:
        net = tiny()
        ft = FineTuner(net, windows(9, masked=masked),
                       FinetuneParams(n_batch=2, n_ubatch=1, lr=1e-3, val_split=0.1,
                                      static=static))
        first = ft.resume(checkpoint) + 1 if resume else 1
        for epoch in range(first, epochs + 1):
            ft.train_epoch()
            if checkpoint is not None:
                ft.save(checkpoint, epoch)
        ft.close()
        return llama.get_weights(net)
    finally:
        ggopt.set_n_threads(prev)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("masked", [False, True])
def test_threads_and_static_give_the_same_bits(masked):
    ref = _train(masked=masked)
    assert not _same(ref, llama.get_weights(tiny()))  # it trained
    assert _same(ref, _train(threads=1, masked=masked))
    assert _same(ref, _train(static=True, masked=masked))


def test_resume_is_bit_exact(tmp_path):
    ref = _train(epochs=2)
    ckpt = tmp_path / "state.gguf"
    _train(epochs=1, checkpoint=ckpt)
    assert _same(ref, _train(epochs=2, checkpoint=ckpt, resume=True))


def _fit(epochs: int, schedule_kind: str, checkpoint=None, resume=False):
    """FineTuner.fit (ggopt.opt.training's loop) with a schedule over 3 epochs' steps."""
    net = tiny()
    w, fp = windows(9), FinetuneParams(n_batch=2, n_ubatch=1, lr=1e-3, val_split=0.1)
    steps = FineTuner.count_steps(w, fp)
    schedule = warmup_cosine(1e-3, 3 * steps, 2) if schedule_kind == "cosine" else \
        epoch_decay(1e-3, 1.0)
    ft = FineTuner(net, w, fp, schedule)
    seen = []
    history = ft.fit(epochs, checkpoint, resume, lambda e, t, v: seen.append((e, t, v)))
    ft.close()
    return llama.get_weights(net), history, seen


@pytest.mark.parametrize("schedule_kind", ["cosine", "decay"])
def test_fit_with_a_schedule_resumes_bit_exact(tmp_path, schedule_kind):
    ref, history, seen = _fit(3, schedule_kind)
    assert [e for e, _, _ in seen] == [1, 2, 3] and len(history) == 3
    assert history.val_loss == [v.loss for _, _, v in seen]
    assert all(np.isfinite(history.train_loss))
    ckpt = tmp_path / "state.gguf"
    _fit(1, schedule_kind, ckpt)
    again, resumed, seen = _fit(3, schedule_kind, ckpt, resume=True)
    assert resumed.resumed_after == 1 and [e for e, _, _ in seen] == [2, 3]
    assert _same(ref, again)
    # the schedule matters: without it (a constant rate) the weights differ
    net = tiny()
    ft = FineTuner(net, windows(9), FinetuneParams(n_batch=2, n_ubatch=1, lr=1e-3,
                                                   val_split=0.1))
    ft.fit(3)
    ft.close()
    assert not _same(ref, llama.get_weights(net))


def test_validation_loss_is_the_mean_over_trained_tokens():
    net = tiny()
    w = windows(10, masked=True)
    ft = FineTuner(net, w, FinetuneParams(val_split=0.2))
    stats = ft.validate()
    ft.close()
    val = slice(ft.n_train_mb, ft.n_train_mb + ft.n_val_mb)
    total, count = 0.0, 0
    for i in range(val.start, val.stop):
        loss, _ = loss_and_grads(net, w.tokens[i:i + 1], w.labels[i:i + 1])
        n = int((w.labels[i] != MASKED).sum())
        total += loss * w.n_ctx
        count += n
    assert stats.n_tokens == count
    assert stats.loss == pytest.approx(total / count, rel=1e-5)


def test_dynamic_graphs_free_each_steps_graph_at_once():
    """A step's context is freed (Context.free) when the next step's graph replaces it: its
    tensors go at once by reference counting, not at Python's next cyclic collection (a pause
    of up to 0.1 s per SmolLM2 step, every few steps)."""
    ft = FineTuner(tiny(), windows(9), FinetuneParams(n_batch=1, n_ubatch=1, lr=1e-3,
                                                      val_split=0.0, static=False))
    gc.collect()
    gc.disable()
    try:
        for i in range(3):  # the graph a cached plan was compiled for stays with the plan
            ft.microbatch(i, True, 1.0)
        ctx = weakref.ref(ft._step_ctx)
        tensors = [weakref.ref(t) for t in ft._step_ctx.tensors]
        for i in range(3, 5):
            ft.microbatch(i, True, 1.0)
        assert ctx() is None
        assert sum(t() is not None for t in tensors) == 0
    finally:
        gc.enable()
        ft.close()


def test_a_freed_context_takes_no_tensors_and_its_tensors_stay_usable():
    ctx = ggopt.Context()
    a = ctx.new_tensor_1d(ggopt.F32, 4)
    b = ggopt.scale(ctx, a, 2.0)
    ctx.free()
    assert len(ctx) == 0 and b.src == (a,)
    with pytest.raises(ggopt.errors.StateError, match="freed"):
        ctx.new_tensor_1d(ggopt.F32, 4)


def test_close_frees_the_compute_buffers_only_while_they_hold_its_graph():
    """close() drops the scheduler's compute buffers (the activations) when the scheduler
    still holds the fine-tune's graph; after another graph was allocated it leaves them."""
    net = tiny()
    ft = FineTuner(net, windows(6), FinetuneParams(val_split=0.0))
    ft.microbatch(0, True, 1.0)
    assert net.sched.held_buffer_bytes() > 0
    ft.close()
    assert net.sched.held_buffer_bytes() == 0
    ft = FineTuner(net, windows(6), FinetuneParams(val_split=0.0, static=False))
    ft.microbatch(0, True, 1.0)
    ctx, cctx, a, y, gf = square_graph(4)
    gb.alloc_ctx_tensors(ctx, net.sched.get_backend(0))
    gb.tensor_set(a, np.arange(4, dtype=np.float32))
    net.sched.reset()
    net.sched.alloc_graph(gf)
    ft.close()
    assert net.sched.allocated_graph is gf and net.sched.held_buffer_bytes() > 0
    net.sched.graph_compute(gf)
    np.testing.assert_array_equal(y.numpy(), [0, 1, 4, 9])
