"""The byte-level llama (``ggopt train``: ggopt.cli.llm on the FineTuner of ggopt.lm):
model, training, GGUF, CLI."""

from __future__ import annotations

import importlib.util
import math

import gguf
import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.cli import llm
from ggopt.io import gguf as ggopt_gguf
from ggopt.lm import FinetuneParams, FineTuner, text_windows
from ggopt.models import llama
from ggopt.models.llama import byte_gguf
from tests.support.llm_ref import logits as ref_logits
from tests.support.llm_ref import random_weights

TINY = llama.Config(n_ctx=16, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48)
TINY_ARGS = ["--ctx", "16", "--embd", "32", "--layers", "2", "--heads", "4", "--heads-kv",
             "2", "--ff", "48", "--batch", "4", "--ubatch", "2", "--epochs", "1"]


def _text(n: int = 6000) -> bytes:
    src = llm.read_corpus(llm.default_corpus_paths()[:1])
    return src[:n]


def _random_weights(cfg: llama.Config, seed: int = 1) -> dict[str, np.ndarray]:
    return random_weights(llama.param_shapes(cfg), seed)


def _model(cfg, weights):
    m = llama.build_model(cfg, gb.Scheduler([gb.cpu_init()]))
    llama.set_weights(m, weights, "test")
    return m


def _ggopt_logits(m, tokens: np.ndarray) -> np.ndarray:
    """Logits (n_seq, n_ctx, n_vocab) of a batch of sequences through one forward graph."""
    inp = llama.make_inputs(m, tokens.shape[0])
    ctx = ggopt.Context()
    out = llama.build_logits(ctx, m, inp)
    gf = ggopt.new_graph_custom(ctx, ggopt.GRAPH_DEFAULT_SIZE, False)
    ggopt.build_forward_expand(gf, out)
    m.sched.reset()
    m.sched.alloc_graph(gf)
    gb.tensor_set(inp.tokens, tokens.astype(np.int32).reshape(-1))
    m.sched.graph_compute(gf)
    got = gb.tensor_get(out).reshape(tokens.shape + (m.cfg.n_vocab,))
    m.sched.reset()
    return got


def test_logits_match_float64_reference(n_threads):
    w = _random_weights(TINY)
    m = _model(TINY, w)
    tokens = np.random.default_rng(0).integers(0, 256, (3, TINY.n_ctx))
    got = _ggopt_logits(m, tokens)
    for s in range(3):  # each sequence attends only to itself
        np.testing.assert_allclose(got[s], ref_logits(TINY, w, tokens[s]), rtol=0, atol=2e-4)


def test_config_errors():
    with pytest.raises(ggopt.errors.ShapeError, match="must divide n_embd"):
        llama.Config(n_embd=30, n_head=4)
    with pytest.raises(ggopt.errors.ShapeError, match="KV heads must divide"):
        llama.Config(n_head=4, n_head_kv=3)


def test_windows_of_any_stride_shifted_labels():
    w = text_windows(list(range(50)), 8, 4)
    assert len(w) == (50 - 8 - 1) // 4
    np.testing.assert_array_equal(w.tokens[2], np.arange(8, 16))
    np.testing.assert_array_equal(w.labels[2], np.arange(9, 17))
    with pytest.raises(ggopt.errors.ShapeError, match="needs at least 13"):
        text_windows(list(range(12)), 8, 4)
    with pytest.raises(ggopt.errors.ShapeError, match="stride must be an int >= 1"):
        text_windows(list(range(50)), 8, 0)


def _train(static: bool, n_batch: int, n_ubatch: int, steps_text: int = 3000):
    m = _model(TINY, llama.init_weights(TINY, 3))
    windows = text_windows(list(_text(steps_text)), TINY.n_ctx, 8)
    tuner = FineTuner(m, windows, FinetuneParams(n_batch=n_batch, n_ubatch=n_ubatch, lr=3e-3,
                                                 static=static))
    history = tuner.fit(2)
    tuner.close()
    return llama.get_weights(m), history


@pytest.mark.parametrize("n_batch,n_ubatch", [(2, 2), (4, 2)])
def test_dynamic_equals_static_bit_for_bit(n_batch, n_ubatch):
    w_dyn, h_dyn = _train(False, n_batch, n_ubatch)
    w_sta, h_sta = _train(True, n_batch, n_ubatch)
    for name in w_dyn:
        np.testing.assert_array_equal(w_dyn[name], w_sta[name], err_msg=name)
    assert h_dyn.train_loss == h_sta.train_loss and h_dyn.val_loss == h_sta.val_loss
    assert h_dyn.train_loss[1] < h_dyn.train_loss[0]  # it learns
    start = llama.init_weights(TINY, 3)
    assert not np.array_equal(w_dyn["blk.0.attn_k.weight"], start["blk.0.attn_k.weight"])


def test_gguf_keys_types_names_and_round_trip(tmp_path):
    w = _random_weights(TINY)
    path = tmp_path / "m.gguf"
    byte_gguf.save(path, TINY, w)
    reader = gguf.GGUFReader(path)
    f = reader.fields
    V = gguf.GGUFValueType
    u32 = {"context_length": 16, "embedding_length": 32, "block_count": 2,
           "feed_forward_length": 48, "attention.head_count": 4,
           "attention.head_count_kv": 2, "rope.dimension_count": 8, "vocab_size": 256}
    for key, value in u32.items():
        field = f[f"llama.{key}"]
        assert field.types == [V.UINT32] and field.contents() == value, key
    for key, value in (("attention.layer_norm_rms_epsilon", 1e-5), ("rope.freq_base", 1e4)):
        field = f[f"llama.{key}"]
        assert field.types == [V.FLOAT32] and field.contents() == pytest.approx(value), key
    assert f["general.architecture"].contents() == "llama"
    assert f["tokenizer.ggml.model"].contents() == "rwkv"
    tokens = f["tokenizer.ggml.tokens"].contents()
    assert tokens[0] == "\\x00" and tokens[255] == "\\xff" and len(tokens) == 256
    names = {t.name: list(t.shape) for t in reader.tensors}
    assert names["token_embd.weight"] == [32, 256] and names["output.weight"] == [32, 256]
    assert names["blk.1.attn_k.weight"] == [32, 16] and names["blk.0.ffn_down.weight"] == [48, 32]
    assert set(names) == set(llama.param_shapes(TINY))
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    cfg, back = byte_gguf.load(path)
    assert cfg == TINY
    for name in w:
        np.testing.assert_array_equal(back[name], w[name])


def test_load_refuses_other_architectures(tmp_path):
    path = tmp_path / "mnist.gguf"
    ggopt_gguf.save(path, {"fc1.weight": np.zeros((2, 3), np.float32)},
                    {"general.architecture": "mnist-fc"})
    with pytest.raises(ggopt.errors.ShapeError, match="'mnist-fc' is not supported"):
        byte_gguf.load(path)


def _write(tmp_path, name: str, content: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(content)
    return str(p)


def test_cli_train_generate_eval(tmp_path, capsys):
    # Invalid UTF-8 and NUL bytes are fine: tokens are bytes.
    text = _write(tmp_path, "t.txt", _text(4000) + b"\xff\xfe\x00")
    out = tmp_path / "m.gguf"
    plot = tmp_path / "p.png"
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    assert llm.main(["train", "--text", text, "--out", str(out), *TINY_ARGS,
                     *(["--plot", str(plot)] if has_mpl else [])]) == 0
    captured = capsys.readouterr().out
    assert "epoch 1:" in captured and "bits/byte=" in captured and "tokens/s" in captured
    assert out.exists() and plot.exists() == has_mpl
    assert llm.main(["generate", "--model", str(out), "--prompt", "def ", "-n", "20",
                     "--seed", "1"]) == 0
    gen = capsys.readouterr().out
    assert gen.startswith("def ") and "tokens/s" in gen
    assert llm.main(["generate", "--model", str(out), "-n", "5", "--temp", "0"]) == 0
    assert llm.main(["eval", "--model", str(out), "--text", text]) == 0
    ev = capsys.readouterr().out
    assert "perplexity: " in ev and "bits per byte=" in ev
    loss = float(ev.split("loss=")[1].split()[0])
    bpb = float(ev.split("bits per byte=")[1].split()[0])
    ppl = float(ev.split("perplexity: ")[1].split()[0])
    assert bpb == pytest.approx(loss / math.log(2), abs=1e-3)
    assert ppl == pytest.approx(math.exp(loss), rel=1e-4)


def test_validation_matches_reference_loss(tmp_path):
    w = _random_weights(TINY)
    path = tmp_path / "m.gguf"
    byte_gguf.save(path, TINY, w)
    cfg, weights = byte_gguf.load(path)
    m = _model(cfg, weights)
    tokens = np.frombuffer(_text(200), np.uint8).astype(np.int64)
    windows = text_windows(tokens.tolist(), 16, 16)  # 11 windows: 5 train, 6 held out
    tuner = FineTuner(m, windows, FinetuneParams(val_split=0.5))
    got = tuner.validate()
    tuner.close()
    losses = []
    for i in range(5, 11):
        x, y = tokens[16 * i:16 * i + 16], tokens[16 * i + 1:16 * i + 17]
        z = ref_logits(cfg, w, x)
        lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
        losses.append((lse - z[np.arange(16), y]).mean())
    assert got.n_tokens == 6 * 16
    assert got.loss == pytest.approx(np.mean(losses), abs=1e-4)


@pytest.mark.parametrize("case", ["empty", "short", "heads", "batch"])
def test_cli_train_errors_write_nothing(tmp_path, capsys, case):
    out = tmp_path / "m.gguf"
    args = ["train", "--out", str(out), *TINY_ARGS]
    if case == "empty":
        args += ["--text", _write(tmp_path, "e.txt", b"")]
    elif case == "short":
        args += ["--text", _write(tmp_path, "s.txt", b"x" * 16)]
    elif case == "heads":
        args += ["--text", _write(tmp_path, "t.txt", _text(3000)), "--heads", "5"]
    else:
        args += ["--text", _write(tmp_path, "t.txt", _text(3000)), "--ubatch", "3"]
    assert llm.main(args) == 1
    err = capsys.readouterr().err
    assert "llm: error:" in err
    expected = {"empty": "needs at least", "short": "needs at least",
                "heads": "must divide n_embd",
                "batch": "must divide the batch"}[case]
    assert expected in err
    assert not out.exists()
    assert not any(p.suffix == ".gguf" or ".tmp" in p.name for p in tmp_path.iterdir())


def test_cli_generate_eval_refuse_other_architecture(tmp_path, capsys):
    path = tmp_path / "mnist.gguf"
    ggopt_gguf.save(path, {"fc1.weight": np.zeros((2, 3), np.float32)},
                    {"general.architecture": "mnist-fc"})
    before = path.read_bytes()
    assert llm.main(["generate", "--model", str(path), "-n", "3"]) == 1
    assert "'mnist-fc' is not supported" in capsys.readouterr().err
    text = _write(tmp_path, "t.txt", _text(500))
    assert llm.main(["eval", "--model", str(path), "--text", text]) == 1
    assert "'mnist-fc' is not supported" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_cli_eval_text_too_short(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    byte_gguf.save(path, TINY, _random_weights(TINY))
    text = _write(tmp_path, "t.txt", b"abc")
    assert llm.main(["eval", "--model", str(path), "--text", text]) == 1
    assert "too few" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_model_learns_below_unigram_entropy():
    text = llm.read_corpus(llm.default_corpus_paths()[:2])[:60000]
    cfg = llama.Config(n_ctx=32, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=192)
    m = _model(cfg, llama.init_weights(cfg, 0))
    windows = text_windows(list(text), cfg.n_ctx, cfg.n_ctx)
    fp = FinetuneParams(n_batch=8, n_ubatch=8, lr=3e-3, static=False)
    assert FineTuner.count_steps(windows, fp) >= 200  # a few hundred optimizer steps
    tuner = FineTuner(m, windows, fp)
    history = tuner.fit(1)
    tuner.close()
    h1_nats = llm.unigram_entropy_bits(np.frombuffer(text, np.uint8)) * math.log(2)
    assert history.val_loss[0] < h1_nats


def test_cli_checkpoint_resume_is_bit_exact_with_a_schedule(tmp_path, capsys):
    text = _write(tmp_path, "t.txt", _text(3000))
    args = [a for a in TINY_ARGS if a not in ("--epochs", "1")]
    common = ["train", "--text", text, *args, "--decay-epochs", "1", "--lr-min", "1e-4"]
    straight = tmp_path / "straight.gguf"
    assert llm.main([*common, "--epochs", "3", "--out", str(straight)]) == 0
    ckpt, resumed = tmp_path / "ckpt.gguf", tmp_path / "resumed.gguf"
    assert llm.main([*common, "--epochs", "1", "--out", str(resumed), "--checkpoint",
                     str(ckpt)]) == 0
    assert llm.main([*common, "--epochs", "3", "--out", str(resumed), "--checkpoint",
                     str(ckpt), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "epoch 3:" in out.split("saved")[-2]  # the resumed run numbers its epochs 2, 3
    a, b = byte_gguf.load(straight)[1], byte_gguf.load(resumed)[1]
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    before = resumed.read_bytes()
    assert llm.main([*common, "--epochs", "3", "--out", str(resumed), "--checkpoint",
                     str(ckpt), "--resume"]) == 1  # nothing left to train
    assert "already holds 3 epochs" in capsys.readouterr().err
    assert resumed.read_bytes() == before
