"""``ggopt finetune --lora-dropout P`` on a tiny llama: checked before the model loads,
refused without an adapter, in --help with its default, and a mid-epoch --resume that gives the
bytes of an uninterrupted run."""

from __future__ import annotations

import pytest

import ggopt.cli.finetune as finetune_cli
from ggopt.cli.finetune import build_parser
from ggopt.models import llama
from tests.support.finetune_cli import model_and_text, run_cli

CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                   tied_output=True)
@pytest.fixture
def files(tmp_path):
    return model_and_text(tmp_path, CFG, "f32.gguf")


_run = run_cli


def test_help_shows_the_default():
    text = " ".join(build_parser().format_help().split())
    assert "--lora-dropout P" in text and "(default 0: none)" in text


@pytest.mark.parametrize("p", ["1", "-0.5", "nan"])
def test_a_dropout_outside_0_1_fails_before_the_model_loads(tmp_path, files, capsys,
                                                             monkeypatch, p):
    model, text = files

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(finetune_cli, "load", no_load)
    rc, _, err = _run(capsys, "--model", model, "--text", text, "--out", tmp_path / "o.gguf",
                      "--lora", 2, "--lora-dropout", p)
    assert rc == 1 and "--lora-dropout: the LoRA dropout must be a number in [0, 1)" in err, err


def test_without_an_adapter_it_is_refused(tmp_path, files, capsys):
    model, text = files
    with pytest.raises(SystemExit):
        _run(capsys, "--model", model, "--text", text, "--out", tmp_path / "o.gguf",
             "--lora-dropout", 0.1)
    assert "--lora-dropout needs --lora or --adapter" in capsys.readouterr().err


def test_interrupted_mid_epoch_then_resumed_gives_the_same_adapter(tmp_path, files, capsys,
                                                                   monkeypatch):
    model, text = files
    args = ["--model", model, "--text", text, "--ctx", 32, "--lr", 1e-3, "--val-split", 0.1,
            "--batch", 4, "--ubatch", 2, "--epochs", 2, "--no-progress", "--lora", 2,
            "--lora-dropout", 0.2]
    rc, stdout, err = _run(capsys, *args, "--out", tmp_path / "a.gguf", "--adapter-out",
                           tmp_path / "a.lora.gguf")
    assert rc == 0, err
    assert "dropout 0.2" in stdout
    rc, _, err = _run(capsys, *args[:-2], "--out", tmp_path / "c.gguf", "--adapter-out",
                      tmp_path / "c.lora.gguf")
    assert rc == 0, err
    assert (tmp_path / "a.lora.gguf").read_bytes() != (tmp_path / "c.lora.gguf").read_bytes()
    real = finetune_cli.FineTuner._after_step

    def hooked(self, loss):
        if self.schedule.step == 7:
            raise KeyboardInterrupt
        return real(self, loss)

    monkeypatch.setattr(finetune_cli.FineTuner, "_after_step", hooked)
    ckpt = tmp_path / "state.gguf"
    out = ["--out", tmp_path / "b.gguf", "--adapter-out", tmp_path / "b.lora.gguf",
           "--checkpoint", ckpt]
    rc, _, err = _run(capsys, *args, *out, "--save-every", 5)
    assert rc == 130, err
    monkeypatch.undo()
    rc, _, err = _run(capsys, *args, *out, "--resume")
    assert rc == 0, err
    assert (tmp_path / "a.lora.gguf").read_bytes() == (tmp_path / "b.lora.gguf").read_bytes()
