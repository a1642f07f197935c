"""``ggopt finetune --chat --chat-pack`` (issue 32) on a tiny llama: several conversations per
window, the real tokens counted, refused where there is nothing to pack, off by default, and a
run interrupted mid-epoch resumes to the bytes of an uninterrupted one."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

import ggopt.cli.finetune as finetune_cli
from ggopt.cli.finetune import build_parser, main
from ggopt.models import llama
from tests.support.llama_files import V, write

CFG = llama.Config(n_ctx=128, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48,
                   tied_output=True)
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<s>' + m['role'] + '\n' + m['content'] + '</s>\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}")
QA = [("Hi?", "Yes."), ("Copy?", "Verbatim."), ("Change?", "No."), ("Who?", "All."),
      ("Why?", "GPL."), ("Ok", "Ok")]


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "f32.gguf"
    write(model, CFG, key_overrides={"tokenizer.chat_template": (CHAT_TEMPLATE, V.STRING)})
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                       {"role": "assistant", "content": a}]})
                              for q, a in QA * 4) + "\n")
    return model, chat


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_packed_run_counts_the_real_tokens(tmp_path, files, capsys):
    model, chat = files
    base = ["--model", model, "--chat", chat, "--ctx", 128, "--val-split", 0, "--no-progress"]
    counts = {}
    for pack in (False, True):
        rc, stdout, err = _run(capsys, *base, "--out", tmp_path / f"{pack}.gguf",
                               *(["--chat-pack"] if pack else []))
        assert rc == 0, err
        m = re.search(r"trained on (\d+) tokens \(the labelled ones; (\d+) computed\) in "
                      r"[0-9.]+ s: [0-9.]+ tokens/s \((\d+) real tokens", stdout)
        assert m is not None, stdout
        counts[pack] = tuple(int(g) for g in m.groups())
        assert ("conversations packed into" in stdout) == pack
    assert counts[False][0] == counts[True][0]  # the same labelled tokens
    assert counts[False][2] == counts[True][2] < counts[True][1] < counts[False][1]
    assert counts[False][1] == 24 * 128  # one window per conversation


def test_chat_pack_is_refused_without_conversations_and_off_by_default(tmp_path, files,
                                                                       capsys):
    model, _ = files
    text = tmp_path / "t.txt"
    text.write_text("some text " * 100)
    rc, _, err = _run(capsys, "--model", model, "--out", tmp_path / "o.gguf", "--text", text,
                      "--chat-pack")
    assert rc == 1 and "--chat-pack packs chat conversations: it needs --chat" in err
    pc = tmp_path / "pc.jsonl"
    pc.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    rc, _, err = _run(capsys, "--model", model, "--out", tmp_path / "o.gguf", "--chat", pc,
                      "--chat-pack")
    assert rc == 1 and "prompt/completion pairs are padded" in err
    args = build_parser().parse_args(["--model", "m", "--out", "o", "--chat", "c"])
    assert args.chat_pack is False
    assert "Off by default" in " ".join(build_parser().format_help().split())


def test_interrupted_mid_epoch_then_resumed_is_bit_exact(tmp_path, files, capsys,
                                                         monkeypatch):
    model, chat = files
    args = ["--model", model, "--chat", chat, "--chat-pack", "--ctx", 128, "--lr", 1e-3,
            "--val-split", 0.1, "--batch", 1, "--epochs", 2, "--warmup", 2, "--no-progress"]
    rc, _, err = _run(capsys, *args, "--out", tmp_path / "a.gguf")
    assert rc == 0, err
    ckpt = tmp_path / "state.gguf"
    real = finetune_cli.FineTuner._after_step

    def hooked(self, loss):
        if self.schedule.step == 3:  # mid-epoch: epoch 1 has more steps
            assert self.steps_per_epoch > 3
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, loss)

    monkeypatch.setattr(finetune_cli.FineTuner, "_after_step", hooked)
    rc, _, err = _run(capsys, *args, "--out", tmp_path / "b.gguf", "--checkpoint", ckpt)
    assert rc == 130 and err.startswith(f"interrupted at step 3; the state is saved in {ckpt}")
    monkeypatch.undo()
    rc, _, err = _run(capsys, *args, "--out", tmp_path / "b.gguf", "--checkpoint", ckpt,
                      "--resume")
    assert rc == 0, err
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    # a padded run's checkpoint is not resumed by a packed one (other windows)
    padded = [a for a in args if a != "--chat-pack"]
    padded[padded.index("--epochs") + 1] = 3
    rc, _, err = _run(capsys, *padded, "--out", tmp_path / "c.gguf", "--checkpoint", ckpt,
                      "--resume")
    assert rc == 1 and "saved by a different run" in err, err
