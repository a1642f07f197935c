"""Full MNIST (``shared/data/mnist`` next to the repository): train mnist-fc, reload it."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from ggopt.cli import mnist

MNIST_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "mnist"
ACC_RE = re.compile(r"^main: test_acc=(\d+\.\d{2})\+-(\d+\.\d{2})%$", re.M)
LOSS_RE = re.compile(r"^main: test_loss=(\d+\.\d{6})\+-(\d+\.\d{6})$", re.M)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=f"full MNIST not found at {MNIST_DIR}"),
]


def run(*argv: object) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        rc = mnist.main([str(a) for a in argv])
    return rc, out.getvalue()


def test_fc_two_epochs_then_gguf_round_trip(tmp_path):
    """2 epochs of ggml's recipe: 114 physical batches of 500 per epoch, 10k test images."""
    path = tmp_path / "mnist-fc.gguf"
    rc, train_out = run("train", "--arch", "fc", "--data", MNIST_DIR, "--epochs", 2,
                        "--out", path)
    assert rc == 0
    rc, eval_out = run("eval", "--model", path, "--data", MNIST_DIR)
    assert rc == 0
    (acc, _), = ACC_RE.findall(train_out)
    assert float(acc) >= 92.0
    assert ACC_RE.findall(eval_out) == ACC_RE.findall(train_out)
    assert LOSS_RE.findall(eval_out) == LOSS_RE.findall(train_out)
