"""LoRA on a quantized base kept as the file stores it (``base_type="keep"``): the same training
as on the F32-dequantized base, the memory report, and the fine-tune command's
``--base-type keep`` on a tiny byte-vocabulary Q4_1 llama."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as GQT

import ggopt
from ggopt.cli.finetune import main
from ggopt.errors import StateError
from ggopt.lm import lora
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.lm.memory import memory_report
from ggopt.models import llama
from tests.support.finetune import windows
from tests.support.llama_files import Q, write

CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                   tied_output=True)
TEXT = ("GNU GENERAL PUBLIC LICENSE. Everyone is permitted to copy and distribute verbatim "
        "copies of this license document, but changing it is not allowed. ") * 12


@pytest.fixture
def q4_1(tmp_path):
    types = {n: Q.Q4_1 for n, s in llama.param_shapes(CFG).items() if len(s) == 2}
    types["token_embd.weight"] = Q.Q8_0
    path = tmp_path / "q4_1.gguf"
    write(path, CFG, types=types)
    return path


def _lora_run(path, base_type):
    model = llama.load(path, progress=False, base_type=base_type)
    ad = lora.create(model.net, 4, 8.0, seed=1)
    lora.attach(model.net, ad)
    ft = FineTuner(model.net, windows(12, 32, 256), FinetuneParams(lr=1e-2, val_split=0.2))
    losses = [ft.validate().loss, ft.train_epoch().loss, ft.validate().loss]
    return ft, ad, losses


def test_lora_on_the_kept_base_trains_as_on_the_f32_base(q4_1):
    ft32, ad32, want = _lora_run(q4_1, "f32")
    ftq, adq, got = _lora_run(q4_1, "keep")
    # the kept base's forward products round the activations to 8 bits (ggml's integer
    # products): losses within 1e-3 of the F32 base's, the adapters close
    np.testing.assert_allclose(got, want, rtol=1e-3)
    assert got[2] < got[0]  # it learns
    for name, (a, b) in adq.arrays().items():
        a32, b32 = ad32.arrays()[name]
        for got_w, want_w in ((a, a32), (b, b32)):  # Adam's sign-like steps flip where a
            # gradient is near 0: compare the whole adapter, not each element
            assert np.linalg.norm(got_w - want_w) < 0.25 * np.linalg.norm(want_w)
    ft32.close()
    ftq.close()


def test_memory_report_separates_base_params_optimizer_and_activations(q4_1):
    ft, ad, _ = _lora_run(q4_1, "keep")
    rep = memory_report(ft)
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(q4_1).tensors)
    norms = sum(int(t.n_bytes) for t in GGUFReader(q4_1).tensors if len(t.shape) == 1)
    assert rep.weights_bytes == file_bytes and rep.weights_mapped_bytes == file_bytes - norms
    assert rep.weights_bytes < 0.2 * rep.weights_f32_bytes and not rep.weights_trained
    assert rep.weight_types == {"F32": 5, "Q4_1": 14, "Q8_0": 1}
    assert rep.n_params == ad.n_params() and rep.param_bytes == 4 * ad.n_params()
    # AdamW's two moments; a static step of one micro-batch keeps its gradients in compute
    # memory (no accumulators, as in ggml-opt)
    assert rep.optimizer_bytes == 2 * rep.param_bytes
    assert rep.activation_bytes == ft.net.sched.held_buffer_bytes() > 0
    # tokens, positions, the KQ mask and 32 label ids: no one-hot [n_vocab=256, 32] labels
    assert 32 * 4 < rep.input_bytes < 4 * 32 * 256
    assert rep.peak_rss_bytes > rep.weights_bytes + rep.activation_bytes
    assert [line.split(":")[0] for line in rep.lines()] == ["memory"] * 3  # peak: the CLI's end
    ft.close()


def test_memory_report_of_a_full_fine_tune_counts_the_weights_as_parameters(q4_1):
    model = llama.load(q4_1, progress=False)
    for static, n in ((True, 2), (False, 3)):  # the moments (+ accumulators when dynamic)
        ft = FineTuner(model.net, windows(6, 32, 256), FinetuneParams(val_split=0.0,
                                                                      static=static))
        ft.train_epoch()
        rep = memory_report(ft)
        assert rep.weights_trained and rep.param_bytes == rep.weights_bytes == \
            rep.weights_f32_bytes
        assert rep.optimizer_bytes == n * rep.param_bytes
        ft.close()


def test_cli_base_type_keep_trains_lora_and_writes_adapter_and_merged_model(tmp_path, q4_1,
                                                                            capsys):
    text = tmp_path / "data.txt"
    text.write_text(TEXT)
    out, ad = tmp_path / "merged.gguf", tmp_path / "adapter.gguf"
    rc = main([str(a) for a in ("--model", q4_1, "--out", out, "--adapter-out", ad, "--text",
                                text, "--ctx", 32, "--lr", 1e-2, "--lora", 4, "--base-type",
                                "keep", "--out-type", "keep")])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    assert "memory: base weights (frozen)" in stdout and "14 Q4_1" in stdout
    assert stdout.count("peak memory:") == 1 and "peak RSS" not in stdout  # one figure
    assert "trained on " in stdout
    net = llama.load(q4_1, progress=False).net
    adapter = lora.load(ad, net)
    _, merged, _ = llama.read_weights(out)
    want = lora.merged(llama.get_weights(net), adapter)["blk.1.ffn_up.weight"]
    # re-quantized to Q4_1: within one step (the block's d) of ggml's re-quantization of the
    # exact merge; the merge's own float order may move a code by one (a fixed atol was the
    # half step of most blocks, not of all: it failed on one block of a Zen 3's training)
    raw = gq.quantize(want, GQT.Q4_1)
    step = np.repeat(raw.reshape(*want.shape[:-1], -1, 20)[..., :2].copy().view(np.float16)
                     .astype(np.float32)[..., 0], 32, axis=-1)
    err = np.abs(merged["blk.1.ffn_up.weight"] - gq.dequantize(raw, GQT.Q4_1))
    assert np.all(err <= step * 1.001 + 1e-6)
    np.testing.assert_allclose(merged["blk.1.ffn_up.weight"], want, atol=0.1)
    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    assert types["blk.1.ffn_up.weight"] == "Q4_1" and types["token_embd.weight"] == "Q8_0"


def test_close_gives_the_activations_back_and_a_new_fine_tuner_computes_the_same(q4_1):
    """The fine-tune command writes its model and adapter after ``close()``: by then the
    compute buffers are freed (their memory is most of a step's); the kept weights made no
    decoded panels (products of 32 rows decode per call: only generation's few-row products
    keep them); a second FineTuner on the same model allocates again, with the same bits."""
    import gc
    import weakref

    from ggopt.backend.cpu.ops.quant import PANEL_ROWS, panels_bytes

    gc.collect()  # earlier tests' models (panels_bytes counts every live model's)
    before = panels_bytes()
    ft, _, _ = _lora_run(q4_1, "keep")
    assert ft.windows.n_ctx >= PANEL_ROWS
    sched = ft.net.sched
    first = ft.validate().loss
    held = sched.held_buffer_bytes()
    compute = {id(t.buffer): t.buffer for t in sched.allocated_graph.nodes
               if t.buffer is not None and t.buffer.size == held}
    assert held > 0 and len(compute) == 1  # the compute buffer
    buffer = weakref.ref(compute.popitem()[1])
    assert panels_bytes() == before  # trained and validated without keeping panels
    ft.close()
    del compute
    gc.collect()
    assert buffer() is None and sched.held_buffer_bytes() == 0
    assert panels_bytes() == before
    again = FineTuner(ft.net, windows(12, 32, 256), FinetuneParams(lr=1e-2, val_split=0.2))
    assert again.validate().loss == first
    again.close()


def test_cli_full_fine_tune_with_base_type_keep_is_an_error(tmp_path, q4_1, capsys):
    text = tmp_path / "data.txt"
    text.write_text(TEXT)
    rc = main([str(a) for a in ("--model", q4_1, "--out", tmp_path / "o.gguf", "--text", text,
                                "--ctx", 32, "--base-type", "keep")])
    assert rc == 1
    assert "--base-type keep: a full fine-tune" in capsys.readouterr().err
    assert not (tmp_path / "o.gguf").exists()


def test_full_fine_tune_of_a_kept_model_is_refused_before_anything_is_built(q4_1):
    kept = llama.load(q4_1, progress=False, base_type="keep")
    with pytest.raises(StateError, match="base_type='f32'"):
        FineTuner(kept.net, windows(6, 32, 256), FinetuneParams())
    assert kept.net.sched.held_buffer_bytes() == 0


def test_labels_are_class_ids():
    """The loss reads one I32 id per position (no [n_vocab, N] one-hot tensor); ids outside
    the vocabulary are refused when the FineTuner is made (tests/lm/test_finetune.py)."""
    from ggopt.backend import tensor_get
    from ggopt.lm.finetune import _LossInputs
    from ggopt.lm.windows import MASKED
    from tests.support.finetune import tiny

    net = tiny()
    loss_in = _LossInputs(net, 6)
    assert loss_in.labels.type is ggopt.I32 and loss_in.labels.ne == (6, 1, 1, 1)
    labels = np.array([[1, 5, MASKED], [63, 0, 5]], np.int32)
    loss_in.set(labels, 0.5)
    np.testing.assert_array_equal(tensor_get(loss_in.labels), labels.reshape(-1))
    assert tensor_get(loss_in.weight)[0] == 0.5
