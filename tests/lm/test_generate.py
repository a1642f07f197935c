"""ggopt.lm: generation with a KV cache gives the full forward's logits and greedy tokens, builds
its one-token graph once, holds only the slots it needs; perplexity is llama-perplexity's;
sampling options and the CLI's generate/eval/tokenize refuse bad values naming the option."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from ggopt.backend import tensor_fill
from ggopt.cli import llm
from ggopt.errors import InvalidValueError, OutOfMemoryError, ShapeError
from ggopt.lm import Generator, SamplingParams, generate, perplexity, sample
from ggopt.lm import generation as generate_module
from ggopt.models import llama
from ggopt.models.llama import run
from tests.support.llama_files import write
from tests.support.llm_ref import logits as ref_logits

SMALL = llama.Config(n_ctx=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48)


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "m.gguf"
    w = write(path, SMALL)
    return llama.load(path, progress=False), w, path


def test_kv_cache_steps_give_the_full_forward_logits(small):
    model, w, _ = small
    ids = np.random.default_rng(1).integers(0, 256, 20)
    want = ref_logits(model.cfg, w, ids)
    gen = Generator(model, 24, n_ubatch=3)   # the prompt in chunks of 3, 3, 1
    got = [gen.feed(ids[:7])] + [gen.feed([t]) for t in ids[7:]]
    assert gen.n_past == 20
    for pos, z in zip([6, *range(7, 20)], got, strict=True):
        np.testing.assert_allclose(z, want[pos], rtol=1e-4, atol=1e-4, err_msg=str(pos))


def test_greedy_generation_equals_greedy_full_recompute(small):
    model, _, _ = small
    prompt = [5, 80, 120, 7]
    result = generate(model, prompt, 12, SamplingParams(temp=0))
    seq = list(prompt)
    for _ in range(12):
        seq.append(int(np.argmax(llama.logits(model, seq)[-1])))
    assert result.tokens == seq[4:] and result.stop == "length" and result.n_prompt == 4


def test_one_token_graph_is_planned_once(small, monkeypatch):
    model, _, _ = small
    calls = []
    real = model.net.sched.alloc_graph
    monkeypatch.setattr(model.net.sched, "alloc_graph", lambda g: calls.append(g) or real(g))
    generate(model, [1, 2, 3], 30, SamplingParams(temp=0))
    assert len(calls) == 2  # the prompt's graph, then the one-token graph for all 29 steps


def test_reset_starts_a_new_sequence_on_the_graphs_already_planned(small, monkeypatch):
    """After reset() the logits are a new Generator's bit for bit, whatever the cache held (it
    is zeroed, not just masked), and no graph is built or compiled again."""
    model, _, _ = small

    def run(gen):
        return [gen.feed([9, 8, 7, 6])] + [gen.feed([t]) for t in (5, 4, 3)]

    want = run(Generator(model, 12))
    gen = Generator(model, 12)
    gen.feed([100, 101, 102, 103])
    for t in range(8):  # every slot filled with another sequence's keys and values
        gen.feed([200 + t])
    for t in gen.cache.v:  # and an overflowed one's NaN: masking alone would keep 0 * NaN
        tensor_fill(t, np.nan)
    built = []
    real_step, real_compile = generate_module._Step, model.net.sched._compile
    monkeypatch.setattr(generate_module, "_Step",
                        lambda *a: built.append("graph") or real_step(*a))
    monkeypatch.setattr(model.net.sched, "_compile",
                        lambda *a: built.append("plan") or real_compile(*a))
    gen.reset()
    assert gen.n_past == 0
    for z, w in zip(run(gen), want, strict=True):
        np.testing.assert_array_equal(z.view(np.uint32), w.view(np.uint32))
    assert built == [] and gen.n_past == 7


def test_other_work_on_the_models_scheduler_between_feeds(small):
    """Another Generator or a full forward between two feeds of one size (or around a reset)
    allocated their own graphs on the model's scheduler: the next feed allocates its own again
    (it raised StateError) and gives the uninterrupted logits."""
    model, _, _ = small
    ref = Generator(model, 8)
    want = [ref.feed([1, 2, 3]), ref.feed([4]), ref.feed([5])]
    gen = Generator(model, 8)
    got = [gen.feed([1, 2, 3]), gen.feed([4])]
    Generator(model, 8).feed([9])
    got.append(gen.feed([5]))
    for z, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(z.view(np.uint32), w.view(np.uint32))
    gen.reset()
    llama.logits(model, [7, 7, 7])
    np.testing.assert_array_equal(gen.feed([1, 2, 3]).view(np.uint32), want[0].view(np.uint32))


def test_cache_holds_prompt_plus_new_tokens_only(tmp_path, monkeypatch):
    # A 47 KB file with context_length 30000 allocated ctx^2 until a
    # MemoryError or the OOM killer; now the cache has prompt + n - 1 slots.
    path = tmp_path / "long.gguf"
    cfg = llama.Config(n_ctx=30000, n_embd=16, n_layer=1, n_head=2, n_head_kv=2, n_ff=32)
    write(path, cfg)
    assert os.path.getsize(path) < 50_000
    model = llama.load(path, progress=False)
    sizes = []
    real = generate_module.Generator.__init__

    def spy(self, net, n_ctx, n_ubatch=512):
        sizes.append(n_ctx)
        real(self, net, n_ctx, n_ubatch)

    monkeypatch.setattr(generate_module.Generator, "__init__", spy)
    result = generate(model, [1, 2, 3, 4], 5, SamplingParams(temp=0))
    assert sizes == [8] and len(result.tokens) == 5
    # A full cache (3.7 MiB here) is checked against the memory available before allocating.
    monkeypatch.setattr(run, "available_memory", lambda: 1 << 20)
    with pytest.raises(OutOfMemoryError, match="KV cache of --ctx 30000"):
        Generator(model, 30000)
    monkeypatch.setattr(run, "available_memory", lambda: 1 << 30)
    with pytest.raises(OutOfMemoryError, match="forward over 30000 tokens"):
        perplexity(model, np.zeros(60000, np.int32), 30000)


def test_generation_stops_at_eog_and_at_the_context_cap(small):
    model, _, _ = small
    first = generate(model, [9, 9], 5, SamplingParams(temp=0)).tokens[0]
    r = generate(model, [9, 9], 5, SamplingParams(temp=0), eog=frozenset({first}))
    assert r.tokens == [first] and r.stop == "eog"
    r = generate(model, [9, 9], 50, SamplingParams(temp=0), n_ctx=6)
    assert len(r.tokens) == 5 and r.stop == "context"
    with pytest.raises(ShapeError, match="no room"):
        generate(model, [1] * 6, 3, n_ctx=6)


def test_sampling_rules():
    z = np.array([1.0, 3.0, 2.0, 3.0, -1.0])
    rng = np.random.default_rng(0)
    assert sample(z, SamplingParams(temp=0), rng) == 1  # ties to the lowest id
    assert sample(z, SamplingParams(temp=5.0, top_k=1), rng) == 1
    assert sample(z, SamplingParams(temp=5.0, top_k=0, top_p=1e-6), rng) == 1
    draws = [sample(z, SamplingParams(temp=1.0, top_k=3, top_p=1.0), rng) for _ in range(300)]
    assert set(draws) == {1, 2, 3}  # top-3 only: 0 and 4 never drawn
    a = [sample(z, SamplingParams(), np.random.default_rng(5)) for _ in range(20)]
    b = [sample(z, SamplingParams(), np.random.default_rng(5)) for _ in range(20)]
    assert a == b
    # the smallest normal float32 temperature is accepted and behaves like greedy
    assert sample(z * 10, SamplingParams(temp=1.2e-38), rng) in (1, 3)


@pytest.mark.parametrize("kwargs,option", [
    ({"temp": float("nan")}, "--temp"), ({"temp": 1e-320}, "--temp"),
    ({"temp": -1.0}, "--temp"), ({"temp": float("inf")}, "--temp"),
    ({"seed": -1}, "--seed"), ({"seed": 2**32}, "--seed"), ({"top_k": -1}, "--top-k"),
    ({"top_p": 0.0}, "--top-p"), ({"top_p": 1.5}, "--top-p"), ({"temp": "1"}, "--temp"),
])
def test_bad_sampling_options_name_the_option(kwargs, option):
    with pytest.raises(InvalidValueError, match=option):
        SamplingParams(**kwargs)


def test_perplexity_is_llama_perplexity(small):
    model, w, _ = small
    ids = np.random.default_rng(2).integers(0, 256, 70)
    n_ctx = 16
    for bos in (None, 255):
        nll = []
        for i in range(4):  # 70 // 16 windows; the last 6 tokens unused
            window = ids[16 * i:16 * i + 16].copy()
            if bos is not None:
                window[0] = bos
            z = ref_logits(model.cfg, w, window)
            for j in range(8, 15):  # the second half predicts tokens 9..15
                lse = np.log(np.exp(z[j] - z[j].max()).sum()) + z[j].max()
                nll.append(lse - z[j, ids[16 * i + j + 1]])
        r = perplexity(model, ids, n_ctx, bos=bos)
        assert (r.n_chunks, r.n_scored) == (4, 28)
        assert r.ppl == pytest.approx(math.exp(np.mean(nll)), rel=1e-5)
        err = r.ppl * math.sqrt(np.var(nll) / (len(nll) - 1))
        assert r.ppl_err == pytest.approx(err, rel=1e-4)
    with pytest.raises(ShapeError, match="too few tokens: 31; windows of --ctx 16 need"):
        perplexity(model, ids[:31], 16)


def _run(capsys, *args):
    code = llm.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("args,message", [
    (["--temp", "nan"], "--temp"), (["--temp", "1e-320"], "--temp"),
    (["--temp", "-1"], "--temp"), (["--seed", "-1"], "--seed"),
    (["--top-p", "2"], "--top-p"), (["--ctx", "0"], "--ctx"),
])
def test_cli_generate_bad_options(small, capsys, args, message):
    _, _, path = small
    code, _, err = _run(capsys, "generate", "--model", str(path), "-n", "2", *args)
    assert code == 1 and f"llm: error: {message}" in err and "Traceback" not in err


def test_cli_generate_any_bytes_prompt(small, capsys):
    _, _, path = small
    prompt = os.fsdecode(b"\xff\xfe\x00abc\xc3")  # what Python makes of such argv bytes
    code, out, _ = _run(capsys, "generate", "--model", str(path), "--prompt", prompt, "-n",
                        "4", "--temp", "0")
    assert code == 0 and "tokens/s" in out and out.startswith("\ufffd\ufffd\x00abc")
    pf = small[2].parent / "prompt.bin"
    pf.write_bytes(b"\x80\x81")
    assert _run(capsys, "generate", "--model", str(path), "--prompt-file", str(pf), "-n",
                "2")[0] == 0


def test_cli_generate_refuses_nan_weights(tmp_path, capsys):
    path = tmp_path / "nan.gguf"
    w = write(tmp_path / "ok.gguf", SMALL)
    w["token_embd.weight"][7, 3] = np.nan
    write(path, SMALL, weights=w)
    code, _, err = _run(capsys, "generate", "--model", str(path), "-n", "2")
    assert code == 1 and "tensor 'token_embd.weight' holds 1 NaN" in err


def test_cli_eval_and_tokenize(small, capsys, tmp_path):
    model, _, path = small
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 2)
    code, out, _ = _run(capsys, "eval", "--model", str(path), "--text", str(text), "--ctx",
                        "64")
    assert code == 0
    want = perplexity(model, list(text.read_bytes()), 64)
    assert f"perplexity: {want.ppl:.4f} +/- {want.ppl_err:.4f}" in out
    code, out, _ = _run(capsys, "tokenize", "--model", str(path), "--prompt", "ab\n")
    assert code == 0 and out.strip() == "[97, 98, 10]"
    code, out, _ = _run(capsys, "tokenize", "--model", str(path), "--text", str(text))
    assert out.strip() == str(list(range(256)) * 2)


def test_chat_templates_render_and_fail_clearly(small):
    from pathlib import Path

    tok = small[0].require_tokenizer()
    qwen = Path.home() / ".cache/ggopt/llama.cpp-models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    if qwen.is_file():
        text = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                       add_generation_prompt=True, template=qwen.read_text())
        assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(InvalidValueError, match="failed to render: no"):
        tok.apply_chat_template([], template="{{ raise_exception('no') }}")
    with pytest.raises(InvalidValueError, match="does not compile"):
        tok.apply_chat_template([], template="{% for %}")
    with pytest.raises(InvalidValueError, match="chat_template"):
        tok.apply_chat_template([])


def test_cli_generate_chat_without_template(small, capsys):
    code, _, err = _run(capsys, "generate", "--model", str(small[2]), "--chat", "-n", "2")
    assert code == 1 and "no tokenizer.chat_template" in err


def test_cli_eval_progress_suits_stderr_and_no_progress_silences_it(small, capsys, tmp_path):
    _, _, path = small
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 2)
    args = ["eval", "--model", str(path), "--text", str(text), "--ctx", "64"]
    code, out, err = _run(capsys, *args)
    assert code == 0 and "\r" not in err  # captured stderr is not a terminal: lines
    lines = [line for line in err.splitlines() if line.startswith("eval: [")]
    assert [line.split("]")[0] for line in lines] == [f"eval: [{i}/8" for i in range(1, 9)]
    code, quiet_out, quiet_err = _run(capsys, *args, "--no-progress")
    assert code == 0 and "eval: [" not in quiet_err
    ppl = [line for line in out.splitlines() if line.startswith("perplexity: ")]
    assert len(ppl) == 1 and ppl[0] in quiet_out
