"""The MNIST example's long-run options: --checkpoint/--resume and the learning-rate schedule."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

import ggopt
from ggopt.cli import mnist
from ggopt.io import gguf


@pytest.fixture(autouse=True)
def _default_threads():
    yield
    ggopt.set_n_threads(None)


def run(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = mnist.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def test_resume_gives_the_uninterrupted_model(tmp_path):
    common = ("train", "--arch", "fc", "--lr", "2e-3", "--decay-epochs", "1", "--lr-min",
              "5e-4")
    rc, out_straight, _ = run(*common, "--epochs", 3, "--out", tmp_path / "a.gguf")
    assert rc == 0
    ckpt = tmp_path / "state.gguf"
    rc, _, _ = run(*common, "--epochs", 1, "--out", tmp_path / "b.gguf", "--checkpoint", ckpt)
    assert rc == 0 and gguf.load(ckpt)[0]["ggopt.schedule.kind"] == "epoch_decay"
    rc, out, err = run(*common, "--epochs", 3, "--out", tmp_path / "b.gguf", "--checkpoint",
                       ckpt, "--resume")
    assert rc == 0, err
    assert "resuming from" in err and "epoch 0002/0003" in err and "epoch 0001/" not in err
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert out.splitlines()[-2:] == out_straight.splitlines()[-2:]  # test loss and accuracy


def test_warmup_schedule_spans_the_run(tmp_path):
    ckpt = tmp_path / "state.gguf"
    rc, _, err = run("train", "--arch", "fc", "--epochs", 2, "--warmup", 2, "--out",
                     tmp_path / "a.gguf", "--checkpoint", ckpt)
    assert rc == 0, err
    meta = gguf.load(ckpt)[0]
    assert (meta["ggopt.schedule.kind"], meta["ggopt.schedule.total_steps"]) == \
        ("warmup_cosine", 6)
    assert meta["ggopt.schedule.step"] == 6
    # Resuming with another plan (3 epochs: 9 steps) is refused, naming the difference.
    rc, _, err = run("train", "--arch", "fc", "--epochs", 3, "--warmup", 2, "--out",
                     tmp_path / "b.gguf", "--checkpoint", ckpt, "--resume")
    assert rc == 1 and "total_steps: expected 9, the file holds 6" in err


@pytest.mark.parametrize("argv,message", [
    (["--resume"], "--resume needs --checkpoint"),
    (["--decay-epochs", "2", "--warmup", "5"], "pick one"),
    (["--lr-min", "1e-5"], "--lr-min needs --decay-epochs or --warmup"),
    (["--warmup", "1", "--lr-min", "0.1"], "must be below --lr"),
    (["--lr", "0"], "expected a positive number"),
    (["--warmup", "-1"], "expected an integer >= 0"),
])
def test_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        mnist.main(["train", "--arch", "fc", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_input_errors(tmp_path):
    rc, _, err = run("train", "--arch", "fc", "--epochs", 1, "--warmup", 3, "--out",
                     tmp_path / "a.gguf")
    assert rc == 1 and "total_steps must exceed warmup" in err
    (tmp_path / "bad.gguf").write_bytes(b"GGUF")
    rc, _, err = run("train", "--arch", "fc", "--epochs", 1, "--out", tmp_path / "a.gguf",
                     "--checkpoint", tmp_path / "bad.gguf", "--resume")
    assert rc == 1 and "gguf_init_from_file" in err and "bad.gguf" in err
    rc, _, err = run("train", "--arch", "fc", "--epochs", 1, "--out", tmp_path / "a.gguf",
                     "--checkpoint", tmp_path / "missing.gguf", "--resume")
    assert rc == 1 and "missing.gguf" in err
