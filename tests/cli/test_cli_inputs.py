"""The command lines check their options at the door (and the LLM CLI's
--lr default): values in float32, output paths before training."""

from __future__ import annotations

import os

import pytest

import ggopt
from ggopt.cli import llm, mnist
from ggopt.errors import InvalidValueError
from ggopt.lm import FinetuneParams

TINY_LLM = ["--ctx", "16", "--embd", "16", "--layers", "1", "--heads", "2", "--ff", "16",
            "--batch", "2", "--epochs", "1"]


@pytest.fixture(autouse=True)
def _default_threads():
    yield
    ggopt.set_n_threads(None)  # the CLIs' --threads changes the process-wide setting


def _corpus(tmp_path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"def f(x):\n    return x + 1\n" * 60)
    return str(path)


def _cli_error(main, argv, capsys) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        rc = exc.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("lr", ["1e300", "1e-50", "1e-40", "nan", "inf"])
def test_cli_lr_outside_float32_is_a_usage_error(lr, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    rc, err = _cli_error(llm.main, ["train", "--text", _corpus(tmp_path), "--out", out,
                                    *TINY_LLM, "--lr", lr], capsys)
    assert rc == 2 and "argument --lr" in err, err
    assert not out.exists()
    rc, err = _cli_error(mnist.main, ["train", "--arch", "fc", "--epochs", "1", "--out", out,
                                      "--lr", lr], capsys)
    assert rc == 2 and "argument --lr" in err, err
    assert not out.exists()


@pytest.mark.parametrize("option, value", [("--wd", "2"), ("--wd", "1e-45"),
                                           ("--lr-min", "1e-300"), ("--decay-epochs", "1e-300")])
def test_cli_schedule_and_decay_options_checked_in_float32(option, value, tmp_path, capsys):
    extra = ["--lr-min", "0"] if option == "--decay-epochs" else []
    if option == "--lr-min":
        extra = ["--decay-epochs", "1"]
    argv = ["train", "--text", _corpus(tmp_path), "--out", tmp_path / "m.gguf", *TINY_LLM,
            option, value, *extra]
    rc, err = _cli_error(llm.main, argv, capsys)
    assert rc == 2 and f"argument {option}" in err, err


def test_cli_decay_that_reaches_zero_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    rc, err = _cli_error(mnist.main, ["train", "--arch", "fc", "--epochs", "3", "--out", out,
                                      "--decay-epochs", "1e-30"], capsys)
    assert rc == 1 and "learning rate of optimizer step" in err and "epoch 3" in err, err
    assert "epoch 0001" not in err and not out.exists()


def test_llm_train_params_checked_in_float32():
    with pytest.raises(InvalidValueError, match="lr"):
        FinetuneParams(lr=1e300).check()
    with pytest.raises(InvalidValueError, match="wd"):
        FinetuneParams(wd=1e-42).check()
    with pytest.raises(InvalidValueError, match="val_split"):
        FinetuneParams(val_split=1.0).check()


def test_llm_out_equal_to_text_or_checkpoint_is_refused(tmp_path, capsys):
    text = _corpus(tmp_path)
    before = open(text, "rb").read()
    rc, err = _cli_error(llm.main, ["train", "--text", text, "--out", text, *TINY_LLM], capsys)
    assert rc == 1 and "--out" in err and "same file as --text" in err, err
    linked = tmp_path / "hard-link.txt"
    os.link(text, linked)
    rc, err = _cli_error(llm.main, ["train", "--text", text, "--out", linked, *TINY_LLM],
                         capsys)
    assert rc == 1 and "same file as --text" in err, err
    assert open(text, "rb").read() == before
    ck = tmp_path / "ck.gguf"
    rc, err = _cli_error(llm.main, ["train", "--text", text, "--out", ck, "--checkpoint",
                                    tmp_path / "." / "ck.gguf", *TINY_LLM], capsys)
    assert rc == 1 and "same file as --checkpoint" in err, err
    assert not ck.exists()


def test_llm_output_paths_checked_before_training(tmp_path, capsys):
    text = _corpus(tmp_path)
    (tmp_path / "adir").mkdir()
    for option, value, message in [("--out", tmp_path / "adir", "is a directory"),
                                   ("--checkpoint", tmp_path / "nodir" / "ck.gguf",
                                    "does not exist"),
                                   ("--out", "", "empty")]:
        argv = ["train", "--text", text, *TINY_LLM, option, value]
        if option != "--out":
            argv += ["--out", tmp_path / "m.gguf"]
        rc, err = _cli_error(llm.main, argv, capsys)
        assert rc == 1 and option in err and message in err, err
        assert "epoch 1" not in err
    assert not (tmp_path / "m.gguf").exists()


def test_mnist_output_paths_checked_before_training(tmp_path, capsys):
    (tmp_path / "adir").mkdir()
    out = tmp_path / "m.gguf"
    for argv, message in [(["--out", tmp_path / "adir"], "--out"),
                          (["--out", out, "--checkpoint", tmp_path / "nodir" / "c.gguf"],
                           "--checkpoint"),
                          (["--out", out, "--checkpoint", out], "same file as"),
                          (["--out", out, "--plot", tmp_path / "adir"], "--plot")]:
        rc, err = _cli_error(mnist.main, ["train", "--arch", "fc", "--epochs", "1", *argv],
                             capsys)
        assert rc == 1 and message in err, err
        assert "epoch 0001" not in err
    assert not out.exists()


def test_llm_cli_states_the_lr_that_runs(capsys):
    with pytest.raises(SystemExit):
        llm.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    runs = llm.LR
    parsed = llm._parser().parse_args(["train"])
    assert parsed.lr == runs
    assert f"--lr {runs:g} by default here" in text
    assert f"default {runs:g})" in text
