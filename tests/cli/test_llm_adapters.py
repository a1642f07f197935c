"""Adapters at inference (issue 34, item 4): ``--lora FILE`` (repeatable) and ``--lora-scaled
FILE SCALE`` on ``generate`` and ``eval`` as llama.cpp's; an adapter given as ``--model`` named;
``tokenize`` reads the vocabulary only (item 8)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ggopt.backend import tensor_set
from ggopt.cli import llm, llm_infer
from ggopt.errors import DTypeError
from ggopt.lm import lora
from ggopt.lm.export import export
from ggopt.models import llama
from tests.support.llama_files import write

CFG = llama.Config(n_ctx=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64)
TEXT = ("Everyone is permitted to copy and distribute verbatim copies of this license "
        "document, but changing it is not allowed. ") * 6


def _adapter(path, model_path, seed: int, targets=("attn_q", "ffn_up")) -> None:
    """An adapter with a non-zero B (an untrained one changes nothing)."""
    net = llama.load(model_path, progress=False).net
    ad = lora.create(net, 2, 4.0, targets, seed=seed)
    rng = np.random.default_rng(seed)
    for b in ad.b.values():
        tensor_set(b, (0.3 * rng.standard_normal((b.ne[1], b.ne[0]))).astype(np.float32))
    lora.save(path, ad)


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "m.gguf"
    write(model, CFG)
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    a1, a2 = tmp_path / "a1.gguf", tmp_path / "a2.gguf"
    _adapter(a1, model, 1)
    _adapter(a2, model, 2, ("attn_v", "ffn_down"))
    return model, text, a1, a2


def _merged(tmp_path, model, adapters: list[tuple[object, float]]):
    """The model with ``adapters`` merged at their strengths, written F32."""
    net = llama.load(model, progress=False).net
    weights = dict(llama.get_weights(net))
    for path, strength in adapters:
        ad = lora.load(path, net)
        for name, (a, b) in ad.arrays().items():
            delta = strength * ad.scale(name) * (b.astype(np.float64) @ a.astype(np.float64))
            weights[name] = (weights[name] + delta).astype(np.float32)
    out = tmp_path / "merged.gguf"
    export(model, out, weights, "f32")
    return out


def _ppl(capsys, *argv) -> float:
    assert llm.main([str(a) for a in ("eval", *argv)]) == 0
    out = capsys.readouterr().out
    m = re.search(r"perplexity: ([0-9.]+)", out)
    assert m is not None, out
    return float(m.group(1))


def test_eval_with_lora_equals_the_merged_model(tmp_path, files, capsys):
    model, text, a1, a2 = files
    base = _ppl(capsys, "--model", model, "--text", text, "--ctx", 32)
    one = _ppl(capsys, "--model", model, "--text", text, "--ctx", 32, "--lora", a1)
    assert one != base
    assert one == pytest.approx(_ppl(capsys, "--model", _merged(tmp_path, model, [(a1, 1.0)]),
                                     "--text", text, "--ctx", 32), rel=1e-4)
    both = _ppl(capsys, "--model", model, "--text", text, "--ctx", 32, "--lora", a1,
                "--lora-scaled", a2, "0.5")
    want = _ppl(capsys, "--model", _merged(tmp_path, model, [(a1, 1.0), (a2, 0.5)]),
                "--text", text, "--ctx", 32)
    assert both == pytest.approx(want, rel=1e-4)
    off = _ppl(capsys, "--model", model, "--text", text, "--ctx", 32, "--lora-scaled", a1, "0")
    assert off == pytest.approx(base, rel=1e-6)


def test_generate_with_lora_is_the_merged_models_greedy_text(tmp_path, files, capsys):
    model, _, a1, _ = files
    argv = ["--prompt", "copy ", "-n", "12", "--temp", "0"]
    assert llm.main(["generate", "--model", str(model), "--lora", str(a1), *argv]) == 0
    with_lora = capsys.readouterr().out.splitlines()[0]
    merged = _merged(tmp_path, model, [(a1, 1.0)])
    assert llm.main(["generate", "--model", str(merged), *argv]) == 0
    assert capsys.readouterr().out.splitlines()[0] == with_lora


def test_an_adapter_as_the_model_is_named(files, capsys):
    model, text, a1, _ = files
    assert llm.main(["eval", "--model", str(a1), "--text", str(text)]) == 1
    err = capsys.readouterr().err
    assert "is a LoRA adapter (general.type=adapter), not a model" in err
    assert f"--lora {a1}" in err
    assert llm.main(["eval", "--model", str(model), "--text", str(text), "--lora",
                     str(text) + ".missing"]) == 1
    assert "not a readable file" in capsys.readouterr().err
    assert llm.main(["eval", "--model", str(model), "--text", str(text), "--lora-scaled",
                     str(a1), "x"]) == 1
    assert "the scale must be a number" in capsys.readouterr().err


def test_apply_checks_its_pairs(files):
    model, _, a1, _ = files
    net = llama.load(model, progress=False).net
    ad = lora.load(a1, net)
    with pytest.raises(DTypeError):
        lora.apply(net, [(ad, "1")])  # type: ignore[list-item]
    assert net.projection is None


def test_tokenize_reads_only_the_vocabulary(files, capsys, monkeypatch):
    model, _, _, _ = files

    def no_load(*a, **k):
        raise AssertionError("tokenize loaded the model's tensors")

    monkeypatch.setattr(llm_infer, "load", no_load)
    assert llm.main(["tokenize", "--model", str(model), "--prompt", "abc"]) == 0
    assert capsys.readouterr().out.strip() == "[97, 98, 99]"
