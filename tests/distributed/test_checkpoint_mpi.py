"""Checkpoints of data-parallel runs (``mpiexec -n 2``): rank 0 writes, every rank resumes, and
the result is one process's, bit for bit. Skips where MPI is not installed."""

from __future__ import annotations

import shutil
from pathlib import Path

from ggopt.io import gguf
from tests.support.mpi import needs_mpi, run

pytestmark = needs_mpi

TRAIN = ("-m", "ggopt.examples.mnist", "train", "--arch", "fc", "--lr", "2e-3",
         "--decay-epochs", "1")


def test_two_ranks_checkpoint_and_resume_equal_one_process(tmp_path):
    code, out = run(1, *TRAIN, "--epochs", "3", "--out", str(tmp_path / "one.gguf"))
    assert code == 0, out
    ckpt = tmp_path / "state.gguf"
    code, out = run(2, *TRAIN, "--epochs", "1", "--out", str(tmp_path / "x.gguf"),
                    "--checkpoint", str(ckpt))
    assert code == 0, out
    assert gguf.load(ckpt)[0]["ggopt.state.epoch"] == 1
    after_one = tmp_path / "after-one.gguf"
    shutil.copy(ckpt, after_one)

    code, out = run(2, *TRAIN, "--epochs", "3", "--out", str(tmp_path / "two.gguf"),
                    "--checkpoint", str(ckpt), "--resume")
    assert code == 0, out
    assert out.count("resuming from") == 1  # only rank 0 prints
    assert (tmp_path / "two.gguf").read_bytes() == (tmp_path / "one.gguf").read_bytes()

    # The 2-rank checkpoint also continues in one process.
    code, out = run(1, *TRAIN, "--epochs", "3", "--out", str(tmp_path / "mixed.gguf"),
                    "--checkpoint", str(after_one), "--resume")
    assert code == 0, out
    assert (tmp_path / "mixed.gguf").read_bytes() == (tmp_path / "one.gguf").read_bytes()


def test_two_ranks_refuse_a_mismatching_checkpoint_together(tmp_path):
    ckpt = tmp_path / "state.gguf"
    code, out = run(1, *TRAIN, "--epochs", "1", "--out", str(tmp_path / "x.gguf"),
                    "--checkpoint", str(ckpt))
    assert code == 0, out
    code, out = run(2, "-m", "ggopt.examples.mnist", "train", "--arch", "fc", "--epochs", "2",
                    "--out", str(tmp_path / "y.gguf"), "--checkpoint", str(ckpt), "--resume")
    assert code != 0
    assert "schedule: expected 'constant', the file holds 'epoch_decay'" in out


_MID_PERIOD = """
import sys
from tests.support import ckpt as h
from ggopt import distributed, opt
from ggopt.errors import StateError

comm = distributed.mpi_world()
m, ds = h.model(), h.dataset()
params = opt.default_params(m.sched, h.CE)
params.ctx_compute, params.inputs, params.outputs = m.ctx_compute, m.images, m.logits
params.opt_period, params.comm = 4, comm  # 2 micro-batches per rank and step
with opt.OptContext(params) as ctx:
    ds.get_batch(m.images, ctx.labels, comm.rank)
    ctx.alloc(True)
    ctx.eval(None)
    try:
        ctx.save_state(sys.argv[1], ds)
    except StateError as exc:
        print(f"rank {comm.rank}: {exc}")
    ds.get_batch(m.images, ctx.labels, 2 + comm.rank)
    ctx.alloc(True)
    ctx.eval(None)
    ctx.save_state(sys.argv[1], ds, epoch=5)  # at the end of the period: rank 0 writes
    print(f"rank {comm.rank}: loaded epoch {ctx.load_state(sys.argv[1], ds)}")
"""


def test_two_ranks_save_only_between_optimizer_periods(tmp_path):
    ckpt = tmp_path / "state.gguf"
    repo = str(Path(__file__).resolve().parents[2])
    code, out = run(2, "-c", _MID_PERIOD, str(ckpt), PYTHONPATH=repo)
    assert code == 0, out
    for rank in (0, 1):
        assert f"rank {rank}: data-parallel: the ranks hold different partial gradients" in out
        assert f"rank {rank}: loaded epoch 5" in out
    assert gguf.load(ckpt)[0]["ggopt.state.opt_i"] == 0
