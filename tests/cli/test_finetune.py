"""``python -m ggopt.examples.finetune`` on a tiny byte-vocabulary llama: full and LoRA runs,
the adapter loaded back, bad input as errors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from ggopt.lm import lora
from ggopt.models import llama
from tests.support.families import write_family
from tests.support.finetune_cli import model_and_text, run_cli
from tests.support.llama_files import write

CFG = llama.Config(n_ctx=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64)
@pytest.fixture
def files(tmp_path):
    return model_and_text(tmp_path, CFG, "tiny.gguf")


_run = run_cli


def test_full_fine_tune(tmp_path, files, capsys):
    model, text = files
    out = tmp_path / "out.gguf"
    rc, stdout, err = _run(capsys, "--model", model, "--out", out, "--text", text, "--ctx", 32,
                           "--lr", 1e-3, "--epochs", 2, "--val-split", 0.1)
    assert rc == 0, err
    lines = stdout.splitlines()
    assert lines[-2].startswith("trained ") and "tokens/s" in lines[-2]
    assert lines[-1].startswith("peak memory")
    assert sum(line.startswith("epoch") for line in lines) == 2
    assert any(line.startswith("val before") for line in lines)
    _, before, _ = llama.read_weights(model)
    _, after, _ = llama.read_weights(out)
    assert all(not np.array_equal(before[k], after[k]) for k in before)  # every weight trained


def test_lora_adapter_out_and_back(tmp_path, files, capsys):
    model, text = files
    out, ad = tmp_path / "merged.gguf", tmp_path / "adapter.gguf"
    rc, stdout, err = _run(capsys, "--model", model, "--out", out, "--adapter-out", ad,
                           "--text", text, "--ctx", 32, "--lr", 1e-2, "--lora", 4,
                           "--lora-targets", "attn_q,ffn_up")
    assert rc == 0, err
    assert "trainable parameters (base frozen)" in stdout
    r = GGUFReader(ad)
    assert len(r.tensors) == 2 * 2 * CFG.n_layer
    _, base, _ = llama.read_weights(model)
    _, merged, _ = llama.read_weights(out)
    changed = sorted(k for k in base if not np.array_equal(base[k], merged[k]))
    assert changed == sorted(f"blk.{i}.{t}.weight" for i in range(2)
                             for t in ("attn_q", "ffn_up"))
    net = llama.load(model).net
    adapter = lora.load(ad, net)
    again = lora.merged(llama.get_weights(net), adapter)
    assert np.array_equal(again["blk.1.ffn_up.weight"], merged["blk.1.ffn_up.weight"])
    # continue training the saved adapter
    rc, stdout, err = _run(capsys, "--model", model, "--out", tmp_path / "m2.gguf",
                           "--adapter", ad, "--adapter-out", tmp_path / "a2.gguf",
                           "--text", text, "--ctx", 32, "--lr", 1e-2)
    assert rc == 0, err
    assert "4 adapted weights" in stdout


def _one_epoch_then_resume(capsys, args, tmp_path, ckpt, epochs: int) -> str:
    """One epoch to ``ckpt`` (writing b1.gguf), then ``--resume`` up to ``epochs`` (b.gguf);
    the resumed run's stdout."""
    assert _run(capsys, *args, "--out", tmp_path / "b1.gguf", "--epochs", 1,
                "--checkpoint", ckpt)[0] == 0
    rc, stdout, err = _run(capsys, *args, "--out", tmp_path / "b.gguf", "--epochs", epochs,
                           "--checkpoint", ckpt, "--resume")
    assert rc == 0, err
    assert "resumed after epoch 1" in stdout
    return stdout


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_checkpoint_resume(tmp_path, files, capsys, arch):
    """Two epochs, and one epoch then --resume for the second: the same bytes; for the
    families too (qwen3's q/k norms and tied output; gemma3's post norms and sliding
    window)."""
    model, text = files
    if arch != "llama":
        model = tmp_path / f"{arch}.gguf"
        write_family(model, arch)
    args = ["--model", model, "--text", text, "--ctx", 32, "--lr", 1e-3, "--val-split", 0.1]
    rc, _, err = _run(capsys, *args, "--out", tmp_path / "a.gguf", "--epochs", 2)
    assert rc == 0, err
    ckpt = tmp_path / "state.gguf"
    _one_epoch_then_resume(capsys, args, tmp_path, ckpt, 2)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_schedule_resume_and_plot(tmp_path, files, capsys):
    """--decay-epochs (halving the rate per epoch) through --checkpoint/--resume: the same
    bytes as one run; --plot writes a PNG; a checkpoint that already holds the epochs asked
    for is an error."""
    pytest.importorskip("matplotlib")
    model, text = files
    args = ["--model", model, "--text", text, "--ctx", 32, "--lr", 1e-3, "--val-split", 0.1,
            "--batch", 2, "--ubatch", 1, "--decay-epochs", 1, "--lr-min", 1e-4, "--no-progress"]
    plot = tmp_path / "loss.png"
    rc, stdout, err = _run(capsys, *args, "--out", tmp_path / "a.gguf", "--epochs", 3,
                           "--plot", plot)
    assert rc == 0, err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "optimizer steps of 2 window(s) per epoch" in stdout
    ckpt = tmp_path / "state.gguf"
    stdout = _one_epoch_then_resume(capsys, args, tmp_path, ckpt, 3)
    assert [line.split(":")[0] for line in stdout.splitlines() if line.startswith("epoch")] \
        == ["epoch 2", "epoch 3"]
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    rc, _, err = _run(capsys, *args, "--out", tmp_path / "c.gguf", "--epochs", 1,
                      "--checkpoint", ckpt, "--resume")
    assert rc == 1 and "already holds 3 epochs" in err


def test_progress_bar_on_stderr(tmp_path, files, capsys):
    model, text = files
    rc, _, err = _run(capsys, "--model", model, "--out", tmp_path / "o.gguf", "--text", text,
                      "--ctx", 32, "--val-split", 0.1)
    assert rc == 0, err
    assert "train: [" in err and "val:   [" in err and "loss=" in err
    assert "\r" not in err  # captured stderr is not a terminal: whole lines
    rc, _, err = _run(capsys, "--model", model, "--out", tmp_path / "q.gguf", "--text", text,
                      "--ctx", 32, "--val-split", 0.1, "--no-progress")
    assert rc == 0 and "train: [" not in err and "val:   [" not in err and "load: [" not in err


def test_bad_input(tmp_path, files, capsys):
    model, text = files
    short = tmp_path / "short.txt"
    short.write_text("too short")
    rc, _, err = _run(capsys, "--model", model, "--out", tmp_path / "o.gguf", "--text", short,
                      "--ctx", 32)
    assert rc == 1 and "has 9 tokens" in err and "needs at least 49" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    rc, _, err = _run(capsys, "--model", model, "--out", tmp_path / "o.gguf", "--chat", bad)
    assert rc == 1 and "not JSON" in err
    rc, _, err = _run(capsys, "--model", model, "--out", model, "--text", text)
    assert rc == 2 and "overwrite" in err
    assert not (tmp_path / "o.gguf").exists()


def test_outputs_never_overwrite_the_inputs(tmp_path, files, capsys):
    """--out over the --text file replaced the training text with the model (and --checkpoint
    over --adapter the adapter with a checkpoint); every input is now refused as an output."""
    model, text = files
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "a"}, '
                    '{"role": "assistant", "content": "b"}]}\n')
    ad = tmp_path / "ad.gguf"
    ad.write_bytes(b"adapter")
    cases = [("--out", text, ["--text", text]), ("--plot", text, ["--text", text]),
             ("--out", chat, ["--chat", chat]),
             ("--checkpoint", ad, ["--text", text, "--adapter", ad]),
             ("--adapter-out", ad, ["--text", text, "--adapter", ad])]
    for option, path, data in cases:
        argv = ["--model", model, "--out", tmp_path / "o.gguf", *data, option, path]
        before = path.read_bytes()
        rc, _, err = _run(capsys, *argv)
        assert rc == 1 and "would destroy that file" in err, (option, err)
        assert path.read_bytes() == before
    assert not (tmp_path / "o.gguf").exists()


def test_a_diverged_run_writes_nothing(tmp_path, files, capsys):
    """--lr 1e30 trains the weights to NaN; the run wrote them (exit 0) as a model that
    llama.load refuses, and the adapter beside it."""
    model, text = files
    out, ad = tmp_path / "o.gguf", tmp_path / "ad.gguf"
    rc, _, err = _run(capsys, "--model", model, "--out", out, "--text", text, "--ctx", 16,
                      "--lr", 1e30, "--lora", 2, "--lora-alpha", 1e30, "--adapter-out", ad,
                      "--no-progress")
    assert rc == 1 and "training diverged" in err
    assert not out.exists() and not ad.exists()


def test_huge_ctx_with_chat_data(tmp_path, files, capsys):
    """--chat with --ctx 10**12 allocated the windows first: a raw MemoryError."""
    model, _ = files
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "a"}, '
                    '{"role": "assistant", "content": "b"}]}\n')
    rc, _, err = _run(capsys, "--model", model, "--out", tmp_path / "o.gguf", "--chat", chat,
                      "--ctx", 10**12)
    assert rc == 1 and "the model's context of 64 tokens" in err


def test_chat_long_conversation_is_truncated_with_one_warning(tmp_path, capsys):
    """Issue 32 row 8: one conversation longer than --ctx among short ones aborted the run;
    now it is truncated (one warning line with the counts) and the run trains."""
    import json

    from gguf import GGUFValueType

    model = tmp_path / "chat.gguf"
    tmpl = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
    write(model, CFG, key_overrides={"tokenizer.chat_template": (tmpl, GGUFValueType.STRING)})
    chat = tmp_path / "chat.jsonl"
    short = {"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello there"}]}
    long = {"messages": [{"role": "user", "content": "x"},
                         {"role": "assistant", "content": "y" * 300}]}
    chat.write_text("\n".join(json.dumps(c) for c in [short] * 4 + [long] + [short] * 4))
    out = tmp_path / "o.gguf"
    argv = ["--model", model, "--out", out, "--chat", chat, "--ctx", 48, "--no-progress",
            "--lr", 1e-4]
    rc, _, err = _run(capsys, *argv)
    assert rc == 0, err
    assert err.count("warning: chat data: 1 conversation(s) truncated and 0 skipped") == 1
    rc, _, err = _run(capsys, *argv, "--chat-overflow", "error")
    assert rc == 1 and "conversation 5 has" in err


def test_no_progress_silences_every_bar(tmp_path, files, capsys):
    """Issue 32 row 18: --no-progress still drew the model load's bar."""
    model, text = files
    argv = ["--model", model, "--out", tmp_path / "o.gguf", "--text", text, "--ctx", 32,
            "--lr", 1e-4]
    rc, _, err = _run(capsys, *argv, "--no-progress")
    assert rc == 0, err
    assert "load:" not in err and "train:" not in err and "█" not in err
    rc, _, err = _run(capsys, *argv)
    # without it, the bars are there (as lines: capsys is not a terminal)
    assert rc == 0 and "load:" in err and "train:" in err
