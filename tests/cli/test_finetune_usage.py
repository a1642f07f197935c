"""``python -m ggopt.cli.finetune`` as a user runs it (issue 34), on tiny llamas: a lossy
export warns with the number and the default keeps the training, the defaults per mode and a
--help with every option's default, progress without empty fields, every input checked before
the model loads, Ctrl-C in one line, one peak-memory figure, trained = labelled tokens."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest

import ggopt.cli.finetune as finetune_cli
from ggopt.cli.finetune import LR_FULL, LR_LORA, build_parser, main, parse_args
from ggopt.lm import perplexity
from ggopt.models import llama
from tests.support.llama_files import Q, V, write

CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                   tied_output=True)
TEXT = ("GNU GENERAL PUBLIC LICENSE. Everyone is permitted to copy and distribute verbatim "
        "copies of this license document, but changing it is not allowed. ") * 12
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<s>' + m['role'] + '\n' + m['content'] + '</s>\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}")
HELD_OUT = ("Everyone is permitted to copy this license document; changing it is not "
            "allowed. GNU GENERAL PUBLIC LICENSE. ") * 4


@pytest.fixture
def files(tmp_path):
    f32 = tmp_path / "f32.gguf"
    write(f32, CFG, key_overrides={"tokenizer.chat_template": (CHAT_TEMPLATE, V.STRING)})
    q4_1 = tmp_path / "q4_1.gguf"
    types = {n: Q.Q4_1 for n, s in llama.param_shapes(CFG).items() if len(s) == 2}
    write(q4_1, CFG, types=types)
    text = tmp_path / "data.txt"
    text.write_text(TEXT)
    return f32, q4_1, text


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _ppl(path) -> float:
    model = llama.load(path, progress=False)
    ids = model.require_tokenizer().encode(HELD_OUT.encode(), add_special=True,
                                           parse_special=False)
    return perplexity(model, ids, 32).ppl


def test_default_lora_export_keeps_the_gain_and_a_lossy_one_warns_with_the_number(
        tmp_path, files, capsys):
    """Item 1: on a Q4_1 base, --out-type keep re-quantizes a small LoRA delta away; the run
    said nothing. Now the default export keeps the held-out gain of the F32 merge, and keep
    warns with the share of the change it keeps."""
    _, q4_1, text = files
    # alpha 0.25: a delta below Q4_1's step, as a SmolLM2 LoRA at lr 1e-4 is
    args = ["--model", q4_1, "--text", text, "--ctx", 32, "--lora", 4, "--lora-alpha", 0.25,
            "--lr", 1e-3, "--no-progress"]
    rc, stdout, err = _run(capsys, *args, "--out", tmp_path / "default.gguf")
    assert rc == 0, err
    assert "warning" not in err
    assert "note: the base is quantized (15 Q4_1, 5 F32): the adapter beside the unchanged " \
        "base (--adapter-out FILE) keeps all of the training" in stdout
    rc, stdout, err = _run(capsys, *args, "--out", tmp_path / "f32.gguf", "--out-type", "f32")
    assert rc == 0, err
    rc, stdout, err = _run(capsys, *args, "--out", tmp_path / "keep.gguf", "--out-type", "keep")
    assert rc == 0, err
    m = re.search(r"warning: --out-type keep: the written Q4_1 weights keep (-?\d+)% of the "
                  r"fine-tune's change", err)
    assert m is not None, err
    kept = int(m.group(1)) / 100
    assert kept < 0.5 and f"{round(100 * kept)}% of the change kept" in stdout
    base, default, f32, keep = (_ppl(p) for p in (q4_1, tmp_path / "default.gguf",
                                                  tmp_path / "f32.gguf",
                                                  tmp_path / "keep.gguf"))
    gain_f32 = base - f32
    assert gain_f32 > 0
    assert abs((base - default) - gain_f32) <= 0.1 * gain_f32
    assert abs(base - keep) < 0.5 * gain_f32  # what the warning said: most of it lost


def test_defaults_per_mode_and_a_help_with_every_default(capsys):
    """Item 2: LoRA took the full fine-tune's --lr 1e-5; --help showed RST backticks and 8
    options without help or default."""
    base = ["--model", "m.gguf", "--out", "o.gguf", "--text", "t.txt"]
    assert parse_args(base).lr == LR_FULL == 1e-5
    assert parse_args([*base, "--lora", "8"]).lr == LR_LORA == 1e-4
    assert parse_args([*base, "--adapter", "a.gguf"]).lr == LR_LORA
    assert parse_args([*base, "--lora", "8", "--lr", "2e-4"]).lr == 2e-4
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "`" not in text and "%%" not in text
    assert "default 1e-4 with --lora or --adapter, 1e-5 for a full fine-tune" in text
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, action.option_strings
        if isinstance(action, argparse._StoreTrueAction):
            continue  # a flag: off unless given
        assert "default" in action.help or "required" in action.help, action.option_strings


def test_llm_train_help_has_no_doubled_percent(capsys):
    from ggopt.cli.llm import main as llm_main

    with pytest.raises(SystemExit):
        llm_main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "%%" not in text and "5% held out" in text


def test_progress_says_loss_ppl_tokens_per_second_without_nan(tmp_path, files, capsys):
    """Item 3: every line read loss=3.18862±nan acc=nan±nan%."""
    f32, _, text = files
    rc, _, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--text", text,
                      "--ctx", 32, "--val-split", 0.1)
    assert rc == 0, err
    bars = [b for b in re.split(r"[\r\n]", err) if b.startswith(("train: [", "val:   ["))]
    assert bars and all("nan" not in b and "acc=" not in b for b in bars)
    assert all("tokens/s" in b and "ETA=" in b for b in bars)
    assert any("ppl=" in b for b in bars)


def test_plot_has_the_before_point_and_no_empty_accuracy_panel(tmp_path, files, capsys):
    pytest.importorskip("matplotlib")
    from ggopt.cli.plot import history_figure
    from ggopt.opt import FitHistory

    h = FitHistory()
    nan4 = (float("nan"),) * 4
    h.record((3.0, float("nan"), float("nan"), float("nan")), (2.5, *nan4[1:]), 1.0)
    fig = history_figure(h, before=3.2)
    assert len(fig.axes) == 1  # no accuracy panel for next-token training
    xs = [list(line.get_xdata()) for line in fig.axes[0].get_lines()]
    assert [0, 1] in xs  # the validation before training, then epoch 1
    h2 = FitHistory()
    h2.record((0.5, 0.01, 0.9, 0.01), (0.6, 0.01, 0.85, 0.02), 1.0)
    assert len(history_figure(h2).axes) == 2  # classification keeps its accuracy


@pytest.mark.parametrize("extra, message", [
    (["--text", "MISSING"], "cannot read"),
    (["--text", "LATIN1"], "not UTF-8 text (byte 3"),
    (["--text", "TEXT", "--lora", "0"], "rank must be an int >= 1"),
    (["--text", "TEXT", "--lora", "4", "--lora-targets", "attn_q,wq"], "lora targets"),
    (["--text", "TEXT", "--lora", "65"], "above attn_q's smaller side (64)"),
    (["--text", "TEXT", "--ctx", "100000"], "the model's context of 64 tokens"),
    (["--text", "TEXT", "--ctx", "32", "--checkpoint", "NOCKPT", "--resume"], "does not exist"),
    (["--model", "ADAPTER", "--text", "TEXT"], "is a LoRA adapter"),
])
def test_every_input_is_checked_before_the_model_loads(tmp_path, files, capsys, monkeypatch,
                                                       extra, message):
    """Item 5: these failed only after the model load (seconds to minutes)."""
    f32, _, text = files
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf\xe9 au lait")
    adapter = tmp_path / "adapter.gguf"
    from ggopt.lm import lora

    lora.save(adapter, lora.create(llama.load(f32, progress=False).net, 2, 4.0))
    names = {"MISSING": tmp_path / "missing.txt", "LATIN1": latin1, "TEXT": text,
             "NOCKPT": tmp_path / "none.gguf", "ADAPTER": adapter}
    extra = [str(names.get(a, a)) for a in extra]

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(finetune_cli, "load", no_load)
    model = [] if "--model" in extra else ["--model", f32]
    rc, _, err = _run(capsys, *model, "--out", tmp_path / "o.gguf", *extra)
    assert rc == 1 and message in err, err


def test_resume_of_a_finished_run_and_of_another_ctx_before_the_load(tmp_path, files, capsys,
                                                                      monkeypatch):
    f32, _, text = files
    ckpt = tmp_path / "state.gguf"
    args = ["--model", f32, "--text", text, "--no-progress", "--checkpoint", ckpt]
    assert _run(capsys, *args, "--ctx", 32, "--out", tmp_path / "a.gguf")[0] == 0

    def no_load(*a, **k):
        raise AssertionError("loaded")

    monkeypatch.setattr(finetune_cli, "load", no_load)
    rc, _, err = _run(capsys, *args, "--ctx", 32, "--out", tmp_path / "b.gguf", "--resume")
    assert rc == 1 and "already holds 1 epochs" in err
    rc, _, err = _run(capsys, *args, "--ctx", 16, "--epochs", 2, "--out", tmp_path / "b.gguf",
                      "--resume")
    assert rc == 1 and "ctx differs" in err and "--ctx 32" in err


def test_ctrl_c_ends_with_one_line(tmp_path, files, capsys, monkeypatch):
    """Item 6: Ctrl-C printed a 30-line traceback."""
    f32, _, text = files

    def interrupted(self, progress=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune_cli.FineTuner, "train_epoch", interrupted)
    rc, _, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--text", text,
                      "--ctx", 32, "--no-progress")
    assert rc == 130 and err.strip() == "interrupted"
    assert not (tmp_path / "o.gguf").exists()


def test_summary_lines_file_type_by_name_one_peak_and_labelled_tokens(tmp_path, files, capsys):
    """Item 8: 'f32: file type 0', two peak-memory figures, chat SFT counted padded windows
    as trained."""
    f32, _, _ = files
    chat = tmp_path / "chat.jsonl"
    conv = {"messages": [{"role": "user", "content": "What is it?"},
                         {"role": "assistant", "content": "A license."}]}
    chat.write_text("\n".join(json.dumps(conv) for _ in range(6)) + "\n")
    rc, stdout, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--chat",
                           chat, "--ctx", 64, "--val-split", 0, "--no-progress")
    assert rc == 0, err
    assert "(ALL_F32" in stdout and "file type 0" not in stdout
    assert stdout.count("peak") == 1
    m = re.search(r"trained on (\d+) tokens \(the labelled ones; (\d+) computed\)", stdout)
    assert m is not None, stdout
    assert 0 < int(m.group(1)) < int(m.group(2)) == 6 * 64


def test_labelled_tokens_of_text_data_are_all_computed(tmp_path, files, capsys):
    f32, _, text = files
    rc, stdout, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--text", text,
                           "--ctx", 32, "--val-split", 0, "--no-progress")
    assert rc == 0, err
    m = re.search(r"trained on (\d+) tokens \(the labelled ones; (\d+) computed\)", stdout)
    assert m is not None and m.group(1) == m.group(2)
    assert "(ALL_F32" in stdout and stdout.count("peak") == 1
    assert np.isfinite(_ppl(tmp_path / "o.gguf"))


def _chat(tmp_path):
    chat = tmp_path / "chat.jsonl"
    qa = [("What is it?", "A license."), ("Can I copy it?", "Yes, verbatim."),
          ("Change it?", "No."), ("Who may copy?", "Everyone.")]
    lines = [json.dumps({"messages": [{"role": "user", "content": q},
                                      {"role": "assistant", "content": a}]})
             for q, a in qa * 5]
    chat.write_text("\n".join(lines) + "\n")
    return chat


def test_chat_sft_with_eval_every_and_early_stopping_writes_the_best_state(tmp_path, files,
                                                                           capsys):
    """Item 7: the chat run's last epoch had the worst validation loss, and that is what was
    written. Now --eval-every N validates every N steps, --patience stops, the best evaluated
    state is written, --log writes a JSON line per step and --plot draws it."""
    pytest.importorskip("matplotlib")
    from ggopt.lm import lora
    from ggopt.lm.chat import chat_windows, read_conversations
    from ggopt.lm.finetune import FinetuneParams, FineTuner

    f32, _, _ = files
    chat, log, plot = _chat(tmp_path), tmp_path / "log.jsonl", tmp_path / "loss.png"
    ad = tmp_path / "ad.gguf"
    # lr 3e-2: fast enough to overfit 16 answers, so the validation loss turns up
    rc, stdout, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--chat", chat,
                           "--ctx", 64, "--lora", 4, "--lr", 3e-2, "--epochs", 6,
                           "--val-split", 0.2, "--eval-every", 4, "--patience", 3,
                           "--log", log, "--plot", plot, "--adapter-out", ad, "--no-progress")
    assert rc == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[0]["step"] == 0 and "val_loss" in records[0]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))
    assert all({"epoch", "loss", "lr", "tokens_per_s"} <= set(r) for r in steps)
    assert all(r["lr"] == pytest.approx(3e-2) for r in steps)
    evals = [(r["step"], r["val_loss"]) for r in records
             if r.get("val_loss") is not None]
    best_step, best = min(evals, key=lambda e: e[1])
    m = re.search(r"best evaluated state: step (\d+), val loss ([0-9.]+) \(written\)", stdout)
    assert m is not None, stdout
    assert int(m.group(1)) == best_step and float(m.group(2)) == pytest.approx(best, abs=1e-4)
    if "stopped: early stopping" in stdout:
        per_epoch = sum(r["epoch"] == 1 for r in steps)
        assert steps[-1]["step"] < 6 * per_epoch  # before the last epoch's end
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # what was written is the best state: its held-out loss is the best one logged
    model = llama.load(f32, progress=False)
    net = model.net
    adapter = lora.load(ad, net)
    lora.attach(net, adapter)
    windows = chat_windows(model.require_tokenizer(), read_conversations(chat), 64)
    ft = FineTuner(net, windows, FinetuneParams(val_split=0.2))
    assert ft.validate().loss == pytest.approx(best, rel=1e-5)
    ft.close()


def test_max_steps_stops_the_run(tmp_path, files, capsys):
    f32, _, text = files
    log = tmp_path / "log.jsonl"
    rc, stdout, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--text", text,
                           "--ctx", 32, "--epochs", 3, "--max-steps", 5, "--log", log,
                           "--no-progress")
    assert rc == 0, err
    assert "stopped: --max-steps 5 reached" in stdout
    # the five steps' tokens are counted (the summary said "trained on 0 tokens")
    assert re.search(r"trained on [1-9]\d* tokens \(the labelled ones; [1-9]\d* computed\)", stdout)
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [1, 2, 3, 4, 5]
    assert (tmp_path / "o.gguf").exists()
    with pytest.raises(SystemExit):
        _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--text", text,
             "--patience", 2)
    assert "--patience counts evaluations: give --eval-every N" in capsys.readouterr().err


def _hook_step(monkeypatch, k: int, action) -> None:
    """Run ``action()`` when optimizer step ``k`` (counted over the run) has finished."""
    real = finetune_cli.FineTuner._after_step

    def hooked(self, loss):
        if self.schedule.step == k:
            action()
        return real(self, loss)

    monkeypatch.setattr(finetune_cli.FineTuner, "_after_step", hooked)


@pytest.mark.parametrize("how", ["ctrl-c", "save-every"])
def test_interrupt_mid_epoch_then_resume_is_bit_exact(tmp_path, files, capsys, monkeypatch,
                                                      how):
    """Item 6: a --checkpoint run saved nothing of the epoch in progress. Ctrl-C (SIGINT) at
    step 7 of epoch 1 now saves the exact state there; a hard stop at step 7 leaves the
    --save-every 5 state; --resume continues either to the bytes of an uninterrupted run."""
    import os
    import signal

    f32, _, text = files
    args = ["--model", f32, "--text", text, "--ctx", 32, "--lr", 1e-3, "--val-split", 0.1,
            "--batch", 4, "--ubatch", 2, "--epochs", 2, "--warmup", 3, "--no-progress"]
    rc, _, err = _run(capsys, *args, "--out", tmp_path / "a.gguf")
    assert rc == 0, err
    ckpt = tmp_path / "state.gguf"
    if how == "ctrl-c":
        _hook_step(monkeypatch, 7, lambda: os.kill(os.getpid(), signal.SIGINT))
        extra: list[object] = []
    else:
        def hard():
            raise KeyboardInterrupt

        _hook_step(monkeypatch, 7, hard)
        extra = ["--save-every", 5]
    rc, _, err = _run(capsys, *args, "--out", tmp_path / "b.gguf", "--checkpoint", ckpt, *extra)
    assert rc == 130 and len(err.strip().splitlines()) == 1, err
    if how == "ctrl-c":
        assert err.startswith(f"interrupted at step 7; the state is saved in {ckpt}")
    else:
        assert err.strip() == f"interrupted; the last saved state is in {ckpt}"
    assert not (tmp_path / "b.gguf").exists()
    monkeypatch.undo()
    rc, stdout, err = _run(capsys, *args, "--out", tmp_path / "b.gguf", "--checkpoint", ckpt,
                           "--resume")
    assert rc == 0, err
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_prompt_completion_jsonl_trains_the_completion_only(tmp_path, files, capsys):
    """Item 7: prompt/completion JSON lines (TRL's format) beside messages: the loss on the
    completion (and its EOS), the prompt masked."""
    from ggopt.lm.completions import completion_windows, read_completions
    from ggopt.lm.windows import MASKED

    f32, _, _ = files
    data = tmp_path / "pc.jsonl"
    pairs = [("Q: copy? A:", " yes"), ("Q: change? A:", " no")] * 6
    data.write_text("\n".join(json.dumps({"prompt": p, "completion": c}) for p, c in pairs)
                    + "\n")
    tok = llama.load(f32, progress=False).require_tokenizer()
    w = completion_windows(tok, read_completions(data), 32)
    p, c = tok.encode("Q: copy? A:", add_special=True, parse_special=False), \
        tok.encode(" yes", add_special=False, parse_special=False)
    eos = [] if tok.eos is None else [tok.eos]
    trained = w.labels[0][w.labels[0] != MASKED].tolist()
    assert trained == c + eos  # the completion's tokens, nothing of the prompt
    assert w.tokens[0, :len(p)].tolist() == p
    rc, stdout, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--chat", data,
                           "--ctx", 32, "--lr", 1e-3, "--val-split", 0.2, "--no-progress")
    assert rc == 0, err
    assert f"({w.n_trained()} with a label)" in stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": ""}\n')
    rc, _, err = _run(capsys, "--model", f32, "--out", tmp_path / "o.gguf", "--chat", bad)
    assert rc == 1 and "non-empty completion" in err
