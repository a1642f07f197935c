"""Gradient clipping of a fine-tune (``FinetuneParams.grad_clip``, ``--grad-clip``; issue 34):
PyTorch's ``clip_grad_norm_`` on the optimizer step's gradient, in the graph."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ggopt
import ggopt.cli.finetune as finetune_cli
from ggopt.errors import DTypeError, InvalidValueError, StateError
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.models import llama
from ggopt.opt import OptimizerParams, constant
from tests.support.finetune import loss_and_grads, tiny, windows
from tests.support.llama_files import write

LR, EPS = 1e-3, 1e-3  # a large AdamW eps, so that the update depends on the gradient's scale


def _weights(clip: float | None, static: bool = True, threads: int = 2, n_batch: int = 2,
             epochs: int = 1, checkpoint=None, resume: bool = False) -> dict[str, np.ndarray]:
    prev = ggopt.get_n_threads()
    ggopt.set_n_threads(threads)
    try:
        net = tiny()
        ft = FineTuner(net, windows(9), FinetuneParams(n_batch=n_batch, lr=LR, val_split=0.1,
                                                       static=static, grad_clip=clip))
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


@pytest.mark.parametrize("static", [True, False])
def test_a_clipped_step_is_adamw_on_the_scaled_gradient(static):
    """Two optimizer steps of two micro-batches against a float64 reference: the gradient of
    the step (ggopt's own, tested against PyTorch elsewhere), scaled by min(1, max / (norm +
    1e-6)), then AdamW."""
    clip = 0.5
    base = OptimizerParams()
    base.adamw.eps = EPS
    net, w = tiny(), windows(9)
    ft = FineTuner(net, w, FinetuneParams(n_batch=2, lr=LR, val_split=0.1, static=static,
                                          grad_clip=clip), constant(LR, base))
    assert list(ft.dataset.permutation[:4]) == [0, 1, 2, 3]  # not shuffled: windows 0 to 3
    for i in range(4):
        ft.microbatch(i, True, 0.5)
    got = llama.get_weights(net)
    ft.close()

    ref_net = tiny()
    p = {k: v.astype(np.float64) for k, v in llama.get_weights(ref_net).items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    factors = []
    for step in (1, 2):
        g = {k: np.zeros_like(v) for k, v in p.items()}
        for i in (2 * step - 2, 2 * step - 1):
            _, gi = loss_and_grads(ref_net, w.tokens[i:i + 1], w.labels[i:i + 1], 0.5)
            for k in g:
                g[k] += gi[k]
        norm = math.sqrt(sum(float((x * x).sum()) for x in g.values()))
        factors.append(min(1.0, clip / (norm + 1e-6)))
        for k in p:
            gk = g[k] * factors[-1]
            m[k] = 0.9 * m[k] + 0.1 * gk
            v2[k] = 0.999 * v2[k] + 0.001 * gk * gk
            mh, vh = m[k] / (1 - 0.9 ** step), v2[k] / (1 - 0.999 ** step)
            p[k] -= LR * mh / (np.sqrt(vh) + EPS)
        llama.set_weights(ref_net, {k: x.astype(np.float32) for k, x in p.items()}, "ref")
    assert max(factors) < 0.5  # both steps clipped, and by a lot
    for k in p:
        np.testing.assert_allclose(got[k], p[k], rtol=1e-4, atol=1e-6, err_msg=k)
    unclipped = _weights(None, static=static)  # and the clipping made a difference
    assert any(not np.allclose(unclipped[k], got[k], rtol=1e-3, atol=1e-5) for k in got)


def test_without_clipping_the_bits_are_todays():
    """None builds the graphs of before; a bound never reached scales by exactly 1."""
    ref = _weights(None)
    assert not _same(ref, llama.get_weights(tiny()))  # it trained
    assert _same(ref, _weights(1e30))
    assert _same(_weights(None, static=False, n_batch=1), _weights(1e30, static=False,
                                                                   n_batch=1))


@pytest.mark.parametrize("n_batch", [1, 2])
def test_clipping_is_independent_of_threads_and_graph_kind(n_batch):
    """n_batch 1: the static graph steps on the backward pass's gradients (no accumulators);
    2: on the accumulated ones."""
    ref = _weights(0.2, n_batch=n_batch)
    assert not _same(ref, _weights(None, n_batch=n_batch))
    assert _same(ref, _weights(0.2, threads=1, n_batch=n_batch))
    assert _same(ref, _weights(0.2, static=False, n_batch=n_batch))


def test_resume_is_bit_exact_and_the_run_key_holds_the_bound(tmp_path):
    ref = _weights(0.2, epochs=2)
    ckpt = tmp_path / "state.gguf"
    _weights(0.2, epochs=1, checkpoint=ckpt)
    assert _same(ref, _weights(0.2, epochs=2, checkpoint=ckpt, resume=True))
    with pytest.raises(StateError, match="grad_clip"):
        _weights(0.3, epochs=2, checkpoint=ckpt, resume=True)
    plain = tmp_path / "plain.gguf"  # a checkpoint of a run without clipping
    _weights(None, epochs=1, checkpoint=plain)
    with pytest.raises(StateError, match="grad_clip"):
        _weights(0.2, epochs=2, checkpoint=plain, resume=True)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, 1e-45])
def test_a_bad_bound_is_refused(bad):
    with pytest.raises(InvalidValueError, match="grad_clip"):
        FinetuneParams(grad_clip=bad).check()
    with pytest.raises(InvalidValueError, match="grad_clip"):
        FineTuner(tiny(), windows(9), FinetuneParams(n_batch=2, grad_clip=bad))


def test_a_bound_that_is_no_number_is_refused():
    with pytest.raises(DTypeError, match="grad_clip"):
        FinetuneParams(grad_clip="1").check()  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["0", "-2", "nan", "inf"])
def test_the_cli_refuses_a_bad_bound_before_the_model_loads(tmp_path, capsys, monkeypatch,
                                                             bad):
    model, text = tmp_path / "m.gguf", tmp_path / "t.txt"
    write(model, llama.Config(n_ctx=64, n_embd=64, n_layer=1, n_head=4, n_head_kv=2,
                              n_ff=96))
    text.write_text("some text " * 50)

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(finetune_cli, "load", no_load)
    rc = finetune_cli.main(["--model", str(model), "--text", str(text), "--out",
                            str(tmp_path / "o.gguf"), "--grad-clip", bad])
    err = capsys.readouterr().err
    assert rc == 1 and "--grad-clip" in err, err


def test_help_names_the_option_and_its_default():
    text = finetune_cli.build_parser().format_help()
    assert "--grad-clip MAX_NORM" in text
    assert "default: no clipping" in " ".join(text.split())


def test_the_session_api_passes_the_bound(tmp_path):
    from ggopt.lm import FineTune

    model, text = tmp_path / "m.gguf", tmp_path / "t.txt"
    write(model, llama.Config(n_ctx=64, n_embd=64, n_layer=1, n_head=4, n_head_kv=2,
                              n_ff=96))
    text.write_text("some text to train on. " * 40)
    ft = FineTune(model, progress=False)
    ft.data([text], ctx=32)
    with pytest.raises(InvalidValueError, match="grad_clip"):
        ft.fit(grad_clip=-1.0)
    history = ft.fit(grad_clip=0.5, lr=1e-3)
    assert len(history.train_loss) == 1 and math.isfinite(history.train_loss[0])


@pytest.mark.parametrize("bad", [0.0, math.nan])
def test_opt_params_refuse_a_bad_bound_when_the_context_is_made(bad):
    from ggopt import backend as gb
    from ggopt.opt import LossType, OptContext, default_params

    params = default_params(gb.Scheduler([gb.cpu_init()]), LossType.SUM)
    params.grad_clip = bad
    with pytest.raises(InvalidValueError, match="grad_clip"):
        OptContext(params)


def test_clipping_on_the_array_backend_matches_the_cpu():
    """The NumPy array backend runs the CuPy backend's op code: the clipping ops (sqr, sum,
    sqrt, step, div, mul) give the CPU's result there too."""
    from ggopt import backend as gb
    from ggopt.backend.array.backend import numpy_backend
    from tests.support.finetune import CFG

    def run(sched: gb.Scheduler, clip: float | None) -> dict[str, np.ndarray]:
        net = llama.build_model(CFG, sched)
        llama.set_weights(net, llama.get_weights(tiny()), "tiny")
        ft = FineTuner(net, windows(9), FinetuneParams(n_batch=2, lr=LR, val_split=0.1,
                                                       grad_clip=clip))
        ft.train_epoch()
        ft.close()
        return llama.get_weights(net)

    cpu = run(gb.Scheduler([gb.cpu_init()]), 0.2)
    array = run(gb.Scheduler([numpy_backend(), gb.cpu_init()]), 0.2)
    for k in cpu:
        np.testing.assert_allclose(array[k], cpu[k], rtol=1e-4, atol=2e-5, err_msg=k)
    unclipped = run(gb.Scheduler([gb.cpu_init()]), None)
    assert max(float(np.abs(unclipped[k] - cpu[k]).max()) for k in cpu) > 1e-4
