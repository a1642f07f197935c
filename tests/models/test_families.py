"""The model families beyond llama (issue 31): qwen2, qwen3 and gemma3 load through
``ggopt.models.load``, their KV-cache generation equals the full forward (across gemma3's
sliding window), they fine-tune (full and LoRA) with masked tokens untouched, and bad files are
refused naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from ggopt import backend as gb
from ggopt.errors import GgoptError, ShapeError
from ggopt.lm import Generator, SamplingParams, generate, lora
from ggopt.lm.export import export
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.lm.windows import MASKED, Windows
from ggopt.models import ARCHITECTURES, llama, load
from ggopt.models.llama.run import logits
from tests.support.families import FAMILIES, text_tokens, write_family
from tests.support.finetune import loss_and_grads
from tests.support.llama_files import write

V = GGUFValueType
NAMES = sorted(FAMILIES)


def _file(tmp_path, arch: str, **kw) -> tuple[str, dict[str, np.ndarray]]:
    path = str(tmp_path / f"{arch}.gguf")
    return path, write_family(path, arch, **kw)


@pytest.mark.parametrize("arch", NAMES)
def test_each_family_loads_its_config_and_tensors(tmp_path, arch):
    path, w = _file(tmp_path, arch)
    model = load(path, progress=False)
    assert model.cfg == FAMILIES[arch]
    assert llama.load(path, progress=False).cfg == model.cfg  # the llama entry point too
    got = llama.get_weights(model.net)
    assert got.keys() == w.keys()
    assert all(np.array_equal(got[k], w[k]) for k in w)
    special = {"qwen2": "blk.1.attn_v.bias", "qwen3": "blk.1.attn_k_norm.weight",
               "gemma3": "blk.2.post_ffw_norm.weight"}[arch]
    assert special in w


def test_the_families_differ_where_llama_cpp_says():
    fam = ARCHITECTURES
    assert [n for n, a in fam.items() if a.rope_type == 2] == ["qwen2", "qwen3", "gemma3"]
    assert [n for n, a in fam.items() if a.qk_norm] == ["qwen3", "gemma3"]
    assert [n for n, a in fam.items() if a.post_norms or a.ffn_gelu or a.swa] == ["gemma3"]
    cfg = FAMILIES["gemma3"]
    assert [cfg.is_swa(i) for i in range(3)] == [True, True, False]
    assert [cfg.layer_freq_base(i) for i in range(3)] == [1e4, 1e4, 1e6]


@pytest.mark.parametrize("arch", NAMES)
def test_kv_cache_generation_equals_the_full_forward(tmp_path, arch):
    # gemma3: 40 tokens through a window of 8, so most keys leave the window of the local layers
    path, _ = _file(tmp_path, arch)
    model = load(path, progress=False)
    ids = text_tokens(40)
    full = logits(model, ids)
    gen = Generator(model.net, 64, 4)
    steps = [gen.feed(ids[:6])] + [gen.feed([t]) for t in ids[6:]]
    np.testing.assert_allclose(np.stack(steps), full[5:], rtol=0, atol=2e-5)


def test_the_sliding_window_changes_the_logits(tmp_path):
    cfg = FAMILIES["gemma3"]
    path, w = _file(tmp_path, "gemma3")
    import dataclasses
    wide = dataclasses.replace(cfg, n_swa=64)
    write(tmp_path / "wide.gguf", wide, weights=w)
    ids = text_tokens(30)
    a = logits(load(path, progress=False), ids)
    b = logits(load(tmp_path / "wide.gguf", progress=False), ids)
    np.testing.assert_array_equal(a[:8], b[:8])  # the first 8 tokens see the same keys
    assert np.abs(a[8:] - b[8:]).max() > 1e-2


@pytest.mark.parametrize("arch,case,match", [
    ("qwen3", "missing", "missing tensor.*blk.0.attn_q_norm.weight"),
    ("gemma3", "missing", "missing tensor.*blk.0.post_attention_norm.weight"),
    ("qwen2", "missing", "missing tensor.*blk.0.attn_k.bias"),
    ("qwen3", "head", "tensor 'blk.0.attn_q.weight': expected ggml shape \\[64, 192\\]"),
    ("qwen3", "odd_head", "key_length = 31: the head size must be even"),
    ("qwen3", "value_length", "value_length = 16: ggopt needs the head size 32"),
    ("gemma3", "swa0", "gemma3.attention.sliding_window = 0"),
    ("gemma3", "unknown", "general.architecture 'phi3' is not supported"),
    ("gemma3", "pattern", "sliding_window_pattern flags 2 layers, the model has 3"),
])
def test_bad_family_files_are_refused_naming_the_problem(tmp_path, arch, case, match):
    cfg, a = FAMILIES[arch], arch
    path = tmp_path / "bad.gguf"
    if case == "missing":
        name = match.split(".*")[1].replace("\\", "")
        write(path, cfg, drop=(name,))
    elif case == "head":
        write(path, cfg, key_overrides={f"{a}.attention.key_length": (48, V.UINT32),
                                         f"{a}.attention.value_length": (48, V.UINT32)})
    elif case == "odd_head":
        write(path, cfg, key_overrides={f"{a}.attention.key_length": (31, V.UINT32)})
    elif case == "value_length":
        write(path, cfg, key_overrides={f"{a}.attention.value_length": (16, V.UINT32)})
    elif case == "swa0":
        write(path, cfg, key_overrides={f"{a}.attention.sliding_window": (0, V.UINT32)})
    elif case == "unknown":
        write(path, cfg, arch="phi3")
    elif case == "pattern":
        write(path, cfg, key_overrides={
            f"{a}.attention.sliding_window_pattern": ([True, False], V.ARRAY)})
    sched = gb.Scheduler([gb.cpu_init()])
    with pytest.raises(GgoptError, match=match):
        load(path, sched, progress=False)


def test_bad_family_configs_are_refused():
    with pytest.raises(ShapeError, match="unknown architecture 'phi3'"):
        llama.Config(arch="phi3")
    with pytest.raises(ShapeError, match="need a window n_swa >= 1"):
        llama.Config(arch="gemma3", n_layer=2, swa_layers=(True, False))
    with pytest.raises(ShapeError, match="swa_layers flags 1 layers"):
        llama.Config(arch="gemma3", n_layer=2, n_swa=4, swa_layers=(True,))
    with pytest.raises(ShapeError, match="head size 7 must be even"):
        llama.Config(arch="qwen3", n_embd_head=7)


def _windows(cfg: llama.Config, n: int, masked: bool = False) -> Windows:
    ids = text_tokens(n * 17 + 1)
    tokens = np.stack([ids[i * 17:i * 17 + 16] for i in range(n)])
    labels = np.stack([ids[i * 17 + 1:i * 17 + 17] for i in range(n)])
    if masked:
        labels[:, :6] = MASKED
    return Windows(tokens, labels)


@pytest.mark.parametrize("arch", NAMES)
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_fine_tuning_lowers_the_loss(tmp_path, arch, mode):
    path, _ = _file(tmp_path, arch)
    net = load(path, progress=False).net
    if mode == "lora":
        lora.attach(net, lora.create(net, 4, 8.0, seed=1))
    w = _windows(net.cfg, 4, masked=True)
    ft = FineTuner(net, w, FinetuneParams(n_batch=2, n_ubatch=1, lr=3e-3, val_split=0.0))
    losses = [ft.train_epoch().loss for _ in range(4)]
    ft.close()
    assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize("arch", NAMES)
def test_masked_tokens_get_exactly_zero_gradient(tmp_path, arch):
    # a position whose label is masked contributes nothing: changing what it would predict
    # (its input token, the last of the window) leaves every gradient bit-identical
    path, _ = _file(tmp_path, arch)
    net = load(path, progress=False).net
    w = _windows(net.cfg, 2, masked=True)
    labels = w.labels.copy()
    labels[:, -1] = MASKED
    tokens = w.tokens.copy()
    tokens[:, -1] = (tokens[:, -1] + 7) % 256
    _, g1 = loss_and_grads(net, w.tokens, labels)
    _, g2 = loss_and_grads(net, tokens, labels)
    assert g1.keys() == set(llama.param_shapes(net.cfg))  # biases and q/k norms train too
    for k in g1:
        assert np.array_equal(g1[k], g2[k]), k


@pytest.mark.parametrize("arch", NAMES)
def test_merged_export_and_adapter_keep_the_architecture(tmp_path, arch):
    path, _ = _file(tmp_path, arch)
    net = load(path, progress=False).net
    ad = lora.create(net, 4, 8.0, seed=2)
    rng = np.random.default_rng(3)
    for t in ad.b.values():
        gb.tensor_set(t, (rng.standard_normal((t.ne[1], t.ne[0])) * 0.05).astype(np.float32))
    lora.attach(net, ad)
    ids = text_tokens(24)
    ours = logits(net, ids)
    merged, adapter = tmp_path / "merged.gguf", tmp_path / "adapter.gguf"
    export(path, merged, lora.merged(llama.get_weights(net), ad), "f32")
    lora.save(adapter, ad)
    src, out = GGUFReader(path), GGUFReader(merged)
    assert out.fields["general.architecture"].contents() == arch
    assert set(src.fields) <= set(out.fields)  # every key kept (+ general.file_type)
    assert GGUFReader(adapter).fields["general.architecture"].contents() == arch
    np.testing.assert_allclose(logits(load(merged, progress=False), ids), ours,
                               rtol=0, atol=1e-4)
    base = load(path, progress=False).net
    lora.attach(base, lora.load(adapter, base))
    np.testing.assert_array_equal(logits(base, ids), ours)


@pytest.mark.parametrize("arch", NAMES)
def test_kept_base_and_lora_run_every_family(tmp_path, arch):
    # base_type="keep": the file's (F32) matrices mapped read-only, an adapter on top
    path, _ = _file(tmp_path, arch)
    ids = text_tokens(20)
    kept = load(path, progress=False, base_type="keep")
    np.testing.assert_array_equal(logits(kept, ids), logits(load(path, progress=False), ids))
    lora.attach(kept.net, lora.create(kept.net, 2, 4.0, seed=1))
    w = _windows(kept.cfg, 2)
    ft = FineTuner(kept.net, w, FinetuneParams(n_batch=2, n_ubatch=1, lr=3e-3, val_split=0.0))
    first, second = ft.train_epoch().loss, ft.train_epoch().loss
    ft.close()
    assert second < first


@pytest.mark.parametrize("arch", NAMES)
def test_the_command_lines_run_every_family(tmp_path, arch, capsys):
    from ggopt.cli import finetune, llm
    path, _ = _file(tmp_path, arch)
    text = tmp_path / "t.txt"
    text.write_bytes(text_tokens(400).astype(np.uint8).tobytes())
    out = tmp_path / "out.gguf"
    assert finetune.main(["--model", path, "--out", str(out), "--text", str(text), "--ctx",
                          "32", "--lr", "1e-3", "--lora", "4"]) == 0
    assert llm.main(["eval", "--model", str(out), "--text", str(text), "--ctx",
                           "32"]) == 0
    assert llm.main(["generate", "--model", str(out), "-n", "8", "--temp", "0"]) == 0
    assert "perplexity" in capsys.readouterr().out.lower()
    assert GGUFReader(out).fields["general.architecture"].contents() == arch


def test_a_chat_template_given_by_name_trains_and_is_written_into_the_merged_file(tmp_path,
                                                                                   capsys):
    # a gemma3 file without tokenizer.chat_template (as Gemma 3 270M is shipped)
    from ggopt.cli import finetune, llm
    from ggopt.lm.session import FineTune
    from ggopt.tokenizers.templates import GEMMA3
    path, _ = _file(tmp_path, "gemma3")
    assert "tokenizer.chat_template" not in GGUFReader(path).fields
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, '
                    '{"role": "assistant", "content": "ok -- Bot"}]}\n' * 4)
    out = tmp_path / "out.gguf"
    args = ["--model", path, "--out", str(out), "--chat", str(chat), "--ctx", "64",
            "--lora", "4", "--val-split", "0", "--no-progress"]
    assert finetune.main(args) == 1  # no template in the file: refused, nothing written
    assert "no tokenizer.chat_template" in capsys.readouterr().err and not out.exists()
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    assert finetune.main([*args, "--chat-template", str(bad)]) == 1  # before the model loads
    assert "does not compile" in capsys.readouterr().err and not out.exists()
    assert finetune.main([*args, "--chat-template", "gemma3"]) == 0
    assert GGUFReader(out).fields["tokenizer.chat_template"].contents() == GEMMA3
    assert llm.main(["generate", "--model", path, "--chat", "--prompt", "hi", "-n", "2"]) == 1
    assert llm.main(["generate", "--model", path, "--chat-template", "gemma3"]) == 1
    assert "--chat-template: it applies to --chat" in capsys.readouterr().err
    assert llm.main(["generate", "--model", str(out), "--chat", "--prompt", "hi", "-n", "2",
                     "--temp", "0"]) == 0  # the merged file is self-contained
    assert "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n" in \
        capsys.readouterr().out
    template = tmp_path / "turns.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant] {% endif %}")
    ft = FineTune(path, 4, chat_template=template, progress=False)
    assert ft.data(chat=chat, ctx=64).n_trained() == 4 * len("ok -- Bot\n")  # the answers
    tok = ft.model.require_tokenizer()
    prompt = tok.encode("[user] hi\n[assistant] ", add_special=False)
    want = generate(ft.model, prompt, 3, SamplingParams(temp=0), eog=tok.eog).tokens
    assert ft.generate("hi", 3, chat=True) == tok.decode(want).decode("utf-8", "replace")
    ft.save_merged(tmp_path / "api.gguf")
    assert GGUFReader(tmp_path / "api.gguf").fields["tokenizer.chat_template"].contents() == \
        template.read_text()
