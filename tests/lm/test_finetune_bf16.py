"""Fine-tuning with ``compute_type="bf16"`` (:mod:`ggopt.models.llama.compute`): full (F32
masters rounded to BF16 once per graph) and LoRA (a frozen BF16 base): finite differences
through the BF16 products, static == dynamic graphs, thread-count independence, bit-exact
resume, the F32 default untouched, the base's memory, and the fine-tune command's
``--compute-type``."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt.cli.finetune import main
from ggopt.errors import InvalidValueError, StateError
from ggopt.lm import lora
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.lm.memory import memory_report
from ggopt.models import llama
from tests.support.finetune import loss_and_grads, tiny, windows
from tests.support.llama_files import write

FILE_CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                        tied_output=True)
TEXT = ("GNU GENERAL PUBLIC LICENSE. Everyone is permitted to copy and distribute verbatim "
        "copies of this license document, but changing it is not allowed. ") * 12


def _directional_fd(net, tokens, labels, name, grad, h=0.03):
    """(L(w + h d) - L(w - h d)) / 2h along d = grad / |grad| (the slope |grad| expected)."""
    d = (grad / np.linalg.norm(grad)).astype(np.float32)
    base = llama.get_weights(net) if name in net.params else None
    vals = []
    for s in (1, -1):
        if base is not None:
            w = dict(base)
            w[name] = (base[name] + s * h * d).astype(np.float32)
            llama.set_weights(net, w, "fd")
        vals.append(loss_and_grads(net, tokens, labels)[0])
    if base is not None:
        llama.set_weights(net, base, "fd")
    return (vals[0] - vals[1]) / (2 * h)


def test_full_gradients_through_bf16_products_match_finite_differences():
    w = windows(2, seed=3)
    tok, lab = w.tokens[:1], w.labels[:1]
    net = tiny()
    net.compute_type = "bf16"  # the graph rounds the F32 masters to BF16 for the products
    _, grads = loss_and_grads(net, tok, lab)
    _, grads32 = loss_and_grads(tiny(), tok, lab)
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"):
        g = grads[name]
        slope = _directional_fd(net, tok, lab, name, g)
        # BF16 rounds the perturbed weights and the activations: a loose 5 %
        assert abs(slope - np.linalg.norm(g)) < 0.05 * np.linalg.norm(g)
        rel = np.linalg.norm(g - grads32[name]) / np.linalg.norm(grads32[name])
        assert 0 < rel < 0.03  # the BF16 products' gradient: close to F32's, not equal


def test_lora_gradients_through_the_bf16_base_match_finite_differences():
    w = windows(2, seed=4)
    tok, lab = w.tokens[:1], w.labels[:1]
    net = tiny()
    net.compute_type = "bf16"
    ad = lora.create(net, 4, 8.0, seed=2)
    name = "blk.1.attn_v.weight"
    b0 = np.random.default_rng(5).standard_normal((ad.b[name].ne[1], 4)).astype(np.float32)
    ggopt.backend.tensor_set(ad.b[name], b0 * 0.3)  # B != 0: A gets a gradient
    lora.attach(net, ad)
    _, grads = loss_and_grads(net, tok, lab)
    for t in (ad.a[name], ad.b[name]):
        g = grads[t.name]
        vals = []
        orig = ggopt.backend.tensor_get(t).copy()
        d = (g / np.linalg.norm(g)).astype(np.float32).reshape(orig.shape)
        for s in (1, -1):
            ggopt.backend.tensor_set(t, (orig + s * 0.03 * d).astype(np.float32))
            vals.append(loss_and_grads(net, tok, lab)[0])
        ggopt.backend.tensor_set(t, orig)
        slope = (vals[0] - vals[1]) / 0.06
        assert abs(slope - np.linalg.norm(g)) < 0.05 * np.linalg.norm(g)


def _train(compute_type: str = "bf16", static: bool = True, threads: int = 2,
           epochs: int = 1, checkpoint=None, resume: bool = False, use_lora: bool = False
           ) -> dict[str, np.ndarray]:
    prev = ggopt.get_n_threads()
    ggopt.set_n_threads(threads)
    try:
        net = tiny()
        ad = None
        if use_lora:
            ad = lora.create(net, 4, 8.0, seed=1)
            lora.attach(net, ad)
        fp = FinetuneParams(n_batch=2, n_ubatch=1, lr=1e-3, val_split=0.1, static=static,
                            compute_type=compute_type)
        ft = FineTuner(net, windows(9), fp)
        first = ft.resume(checkpoint) + 1 if resume else 1
        for epoch in range(first, epochs + 1):
            ft.train_epoch()
            if checkpoint is not None:
                ft.save(checkpoint, epoch)
        ft.close()
        if ad is not None:
            return {f"{n}.{h}": arr for n, pair in ad.arrays().items()
                    for h, arr in zip("ab", pair)}
        return llama.get_weights(net)
    finally:
        ggopt.set_n_threads(prev)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)


@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
def test_bf16_static_dynamic_and_thread_counts_give_the_same_bits(use_lora):
    ref = _train(use_lora=use_lora)
    assert not _same(ref, _train(compute_type="f32", use_lora=use_lora))  # BF16 differs
    assert _same(ref, _train(static=False, use_lora=use_lora))
    assert _same(ref, _train(threads=1, use_lora=use_lora))
    assert _same(ref, _train(threads=3, use_lora=use_lora))


def test_bf16_resume_is_bit_exact_and_records_the_compute_type(tmp_path):
    ref = _train(epochs=2)
    ckpt = tmp_path / "state.gguf"
    _train(epochs=1, checkpoint=ckpt)
    assert _same(ref, _train(epochs=2, checkpoint=ckpt, resume=True))
    f32_ckpt = tmp_path / "f32.gguf"
    _train(compute_type="f32", epochs=1, checkpoint=f32_ckpt)
    with pytest.raises(StateError, match="compute_type"):  # an F32 run's state is not BF16's
        _train(epochs=2, checkpoint=f32_ckpt, resume=True)


def test_the_f32_default_is_unchanged():
    """The default trains the same bits as compute_type='f32' spelled out (which builds no
    BF16 node: tests/models/test_llama_bf16.py); its checkpoint's run key is as before."""
    assert FinetuneParams().compute_type == "f32"
    assert _same(_train(compute_type="f32"), _train_default())
    net = tiny()
    ft = FineTuner(net, windows(9), FinetuneParams(n_batch=2, lr=1e-3, val_split=0.1))
    assert "compute_type" not in ft._run_key()
    ft.close()


def _train_default() -> dict[str, np.ndarray]:
    net = tiny()
    ft = FineTuner(net, windows(9), FinetuneParams(n_batch=2, n_ubatch=1, lr=1e-3,
                                                   val_split=0.1))
    ft.train_epoch()
    ft.close()
    return llama.get_weights(net)


def test_an_unknown_compute_type_is_refused():
    with pytest.raises(InvalidValueError, match="compute_type"):
        FineTuner(tiny(), windows(9), FinetuneParams(compute_type="fp8"))


@pytest.fixture
def f32_file(tmp_path):
    path = tmp_path / "m.gguf"
    write(path, FILE_CFG)
    return path


def test_lora_on_a_bf16_base_learns_with_half_the_base_memory(f32_file):
    m = llama.load(f32_file, compute_type="bf16", progress=False)
    with pytest.raises(StateError, match="compute_type"):  # the BF16 base never trains
        FineTuner(m.net, windows(12, 32, 256), FinetuneParams())
    ad = lora.create(m.net, 4, 8.0, seed=1)
    lora.attach(m.net, ad)
    ft = FineTuner(m.net, windows(12, 32, 256), FinetuneParams(lr=1e-2, val_split=0.2))
    before = ft.validate().loss
    ft.train_epoch()
    assert ft.validate().loss < before
    rep = memory_report(ft)
    matrices = sum(t.nelements() for t in m.net.params.values() if t.ne[1] > 1)
    assert rep.weight_types["BF16"] == 7 * FILE_CFG.n_layer + 1
    assert rep.weights_bytes == 2 * matrices + 4 * (
        sum(t.nelements() for t in m.net.params.values()) - matrices)
    ft.close()


@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
def test_cli_compute_type_bf16_trains_and_writes_the_model(tmp_path, f32_file, use_lora,
                                                           capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "o.gguf"
    args = ["--model", f32_file, "--out", out, "--text", text, "--ctx", 32, "--lr", "1e-2",
            "--compute-type", "bf16", "--no-progress", "--val-split", "0.2"]
    if use_lora:
        args += ["--lora", 4]
    assert main([str(a) for a in args]) == 0
    printed = capsys.readouterr().out
    assert "BF16" in printed if use_lora else "(trained)" in printed
    val = [float(line.split("loss=")[-1].split()[0]) for line in printed.splitlines()
           if "val" in line and "loss=" in line]
    assert val[-1] < val[0]  # it learnt
    trained = llama.load(out, progress=False)
    assert {t.type for t in trained.net.params.values()} == {ggopt.F32}
