"""Data-parallel training under ``mpiexec -n 2``: equivalence, faults and misuse.

Each test starts its own MPI job (the ranks run tests/support/dist_worker.py or the MNIST example)
and skips only where MPI is not installed (``pip install 'ggopt[mpi]'``). Every job runs
under a timeout: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ggopt.models.mnist import model as mnist_model
from tests.support.mpi import (
    errors,
    max_rel_diff,
    needs_mpi,
    run,
    worker,
)

pytestmark = needs_mpi












# --- equivalence ----------------------------------------------------------------------------
def test_mnist_example_two_ranks_equals_one_process(tmp_path):
    """ggml's recipe (logical batch 1000 = 2 x 500): each rank holds one micro-batch per step,
    so the all-reduce adds the same two gradients one process adds, once: bit-identical."""
    outs = {}
    for n in (1, 2):
        gguf_path = tmp_path / f"fc{n}.gguf"
        code, out = run(n, "-m", "ggopt.examples.mnist", "train", "--arch", "fc", "--epochs",
                        "1", "--out", str(gguf_path))
        assert code == 0, out
        outs[n] = out
        assert out.count("ggml_opt_fit: training took") == 1, out  # only rank 0 prints
    assert "data-parallel over MPI, 2 ranks" in outs[2]
    one = mnist_model.load_gguf(tmp_path / "fc1.gguf")[1]
    two = mnist_model.load_gguf(tmp_path / "fc2.gguf")[1]
    for name in one:
        assert max_rel_diff(one[name], two[name]) <= 1e-5, name
        assert np.array_equal(one[name], two[name]), name
    scores = [re.findall(r"main: test_(?:loss|acc)=\S+", outs[n]) for n in (1, 2)]
    assert len(scores[0]) == 2 and scores[0] == scores[1]


@pytest.mark.slow  # more processes than cores, or seconds of waiting: CI runs it
def test_mnist_example_four_ranks_match_one_process(tmp_path):
    """4 ranks: the example takes micro-batches of 250 (one per rank per step) instead of 500,
    so the sums run in another order and the result is equal up to rounding."""
    for n in (1, 4):
        code, out = run(n, "-m", "ggopt.examples.mnist", "train", "--arch", "fc", "--epochs",
                        "1", "--out", str(tmp_path / f"fc{n}.gguf"))
        assert code == 0, out
    one = mnist_model.load_gguf(tmp_path / "fc1.gguf")[1]
    four = mnist_model.load_gguf(tmp_path / "fc4.gguf")[1]
    for name in one:
        assert max_rel_diff(one[name], four[name]) <= 1e-5, name


def test_two_micro_batches_per_rank_match_one_process(tmp_path):
    """Logical batch 2000: each rank sums two micro-batches before the all-reduce, so the sum
    is (g1+g2)+(g3+g4) instead of ((g1+g2)+g3)+g4: equal up to rounding."""
    for n, sub in ((1, "one"), (2, "two")):
        (tmp_path / sub).mkdir()
        code, out = worker(n, "fit", str(tmp_path / sub), "2000", "4000")
        assert code == 0, out
    one = np.load(tmp_path / "one" / "result.npz")
    two = np.load(tmp_path / "two" / "result.npz")
    for name in one.files:
        if name.startswith("w:"):
            assert max_rel_diff(one[name], two[name]) <= 1e-5, name
        else:  # the history: losses and accuracies every rank merged
            np.testing.assert_allclose(two[name], one[name], rtol=1e-5, err_msg=name)


def test_dynamic_graphs_two_ranks_equal_one_process(tmp_path):
    for n, sub in ((1, "one"), (2, "two")):
        (tmp_path / sub).mkdir()
        code, out = worker(n, "dynamic", str(tmp_path / sub))
        assert code == 0, out
    np.testing.assert_array_equal(np.load(tmp_path / "two" / "w.npy"),
                                  np.load(tmp_path / "one" / "w.npy"))


def test_communicator_of_one_rank_is_no_communicator(tmp_path):
    code, out = worker(1, "size1", str(tmp_path))
    assert code == 0, out
    assert (tmp_path / "ok").exists()


def test_consistency_check_passes_and_catches_divergence(tmp_path):
    code, out = worker(2, "check", str(tmp_path), "no")
    assert code == 0, out
    assert (tmp_path / "ok").exists()
    code, out = worker(2, "check", str(tmp_path), "yes")
    assert code == 3, out
    for rank in (0, 1):
        assert errors(tmp_path, rank).startswith("StateError: ranks [1] hold parameters"), out


# --- faults ---------------------------------------------------------------------------------
def test_rank_that_raises_ends_every_rank(tmp_path):
    code, out = worker(2, "fault", str(tmp_path), "raise")
    assert code != 0, out
    assert "RuntimeError: rank 1 fails on purpose" in out
    assert "ggopt.distributed: rank 1 of 2: failed with RuntimeError" in out


def test_rank_that_is_killed_ends_every_rank(tmp_path):
    code, out = worker(2, "fault", str(tmp_path), "kill")
    assert code != 0, out
    pids = re.search(r"rank 0 = pid (\d+) on \S+, rank 1 = pid (\d+)", out)
    assert pids, out
    # The launcher names the dead process by pid (MPICH: "PID <pid> RUNNING AT <host>");
    # the ranks' start-up line maps that pid to rank 1.
    launcher_lines = [s for s in out.splitlines() if "rank 1 = pid" not in s]
    assert any(pids.group(2) in s for s in launcher_lines), out


@pytest.mark.slow  # more processes than cores, or seconds of waiting: CI runs it
def test_watchdog_ends_a_job_whose_rank_stalls(tmp_path):
    """Rank 1 sleeps for a minute before its second step; rank 0's watchdog (2 s) aborts."""
    code, out = worker(2, "fault", str(tmp_path), "stall", GGOPT_DIST_TIMEOUT="2")
    assert code != 0, out
    assert re.search(r"rank 0 of 2: waited \d+\.\d s in the gradient all-reduce \(timeout 2 s\)",
                     out), out


def test_example_error_on_every_rank_ends_the_job(tmp_path):
    code, out = run(2, "-m", "ggopt.examples.mnist", "train", "--arch", "fc", "--data",
                    str(tmp_path / "missing"))
    assert code != 0, out
    assert "mnist: error:" in out


@pytest.mark.slow  # more processes than cores, or seconds of waiting: CI runs it
def test_example_refuses_ranks_that_cannot_share_the_batch(tmp_path):
    code, out = run(3, "-m", "ggopt.examples.mnist", "train", "--arch", "fc", "--out",
                    str(tmp_path / "fc.gguf"))
    assert code != 0, out
    assert "3 ranks cannot share a logical batch of 1000 images" in out
    assert not (tmp_path / "fc.gguf").exists()


# --- misuse ---------------------------------------------------------------------------------
@pytest.mark.parametrize("what, expected", [
    ("shape", "ranks disagree on the optimization: parameters (name, type, ne)"),
    ("period", "ranks disagree on the optimization: opt_period is 2 on rank 0 but 4 on rank 1"),
    ("ndata", "ranks disagree on the epoch: ndata is 16 on rank 0 but 24 on rank 1"),
])
def test_disagreeing_ranks_get_the_same_error(tmp_path, what, expected):
    code, out = worker(2, "misuse", str(tmp_path), what)
    assert code == 3, out
    for rank in (0, 1):
        assert errors(tmp_path, rank).startswith(f"ShapeError: {expected}"), out


@pytest.mark.slow  # more processes than cores, or seconds of waiting: CI runs it
def test_opt_period_must_split_over_the_ranks(tmp_path):
    code, out = worker(3, "misuse", str(tmp_path), "none")
    assert code == 3, out
    for rank in (0, 1, 2):
        assert re.match(r"ShapeError: opt_period=2 .* multiple of the 3 ranks",
                        errors(tmp_path, rank)), out


@pytest.mark.parametrize("arch, tied", [("llama", False), ("qwen3", False), ("gemma3", False),
                                        ("gemma3", True)])
def test_finetune_example_two_ranks_equal_one_process(tmp_path, arch, tied):
    """python -m ggopt.examples.finetune under mpiexec -n 2 (--dist): batch 2 of
    micro-batches of 1 window, one per rank per step, the all-reduce adding the two gradients
    one process adds: the same merged model, byte for byte; only rank 0 reports. The same for
    the families' own parts (qwen3's q/k norms; gemma3's post norms and a window of 8 in
    windows of 32). A tied output (``token_embd`` used twice) is not bit-exact: one process
    adds each use's gradient into the accumulator in turn (as ggml does), a rank sums its two
    before the all-reduce; the weights differ by rounding."""
    import dataclasses

    from ggopt.models import llama
    from tests.support.families import FAMILIES, peaked_weights
    from tests.support.llama_files import write

    model, text = tmp_path / "tiny.gguf", tmp_path / "data.txt"
    if arch == "llama":
        write(model, llama.Config(n_ctx=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2,
                                  n_ff=64))
    else:
        cfg = dataclasses.replace(FAMILIES[arch], tied_output=tied)
        write(model, cfg, weights=peaked_weights(cfg))
    text.write_text("Everyone is permitted to copy and distribute verbatim copies. " * 20)
    outs = {}
    for n in (1, 2):
        code, out = run(n, "-m", "ggopt.examples.finetune", "--model", str(model), "--out",
                        str(tmp_path / f"ft{n}.gguf"), "--text", str(text), "--ctx", "32",
                        "--batch", "2", "--ubatch", "1", "--lr", "1e-3", "--val-split", "0.2",
                        "--epochs", "2", "--no-progress", "--threads", "1")
        assert code == 0, out
        assert out.count("trained ") == 1 and out.count("epoch 2:") == 1, out
        outs[n] = out
    assert "data-parallel over MPI, 2 ranks" in outs[2]
    one, two = (tmp_path / "ft1.gguf").read_bytes(), (tmp_path / "ft2.gguf").read_bytes()
    if not tied:
        assert one == two
        return
    w1, w2 = (llama.read_weights(tmp_path / f"ft{n}.gguf")[1] for n in (1, 2))
    assert one != two and max(max_rel_diff(w1[k], w2[k]) for k in w1) < 1e-5


def test_finetune_grad_clip_two_ranks_equal_one_process(tmp_path):
    """--grad-clip under mpiexec -n 2: the norm is taken after the all-reduce, so both ranks
    scale the same summed gradient one process scales: the same merged model, byte for byte
    (and not the unclipped one)."""
    from ggopt.models import llama
    from tests.support.llama_files import write

    model, text = tmp_path / "tiny.gguf", tmp_path / "data.txt"
    write(model, llama.Config(n_ctx=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64))
    text.write_text("Everyone is permitted to copy and distribute verbatim copies. " * 20)
    for n, clip in ((1, []), (1, ["--grad-clip", "0.05"]), (2, ["--grad-clip", "0.05"])):
        code, out = run(n, "-m", "ggopt.examples.finetune", "--model", str(model), "--out",
                        str(tmp_path / f"ft{n}{len(clip)}.gguf"), "--text", str(text),
                        "--ctx", "32", "--batch", "2", "--ubatch", "1", "--lr", "1e-3",
                        "--val-split", "0.2", "--no-progress", "--threads", "1", *clip)
        assert code == 0, out
    clipped = (tmp_path / "ft12.gguf").read_bytes()
    assert clipped == (tmp_path / "ft22.gguf").read_bytes()
    assert clipped != (tmp_path / "ft10.gguf").read_bytes()


def test_finetune_chat_pack_two_ranks_equal_one_process(tmp_path):
    """--chat-pack under mpiexec -n 2: the packed windows split over the ranks as padded ones
    do (each rank sets its own windows' positions and masks): the same merged model, byte for
    byte."""
    import json

    from ggopt.models import llama
    from tests.support.llama_files import V, write

    template = ("{% for m in messages %}{{ '<s>' + m['role'] + '\n' + m['content'] + '</s>\n' }}"
                "{% endfor %}")
    model, chat = tmp_path / "tiny.gguf", tmp_path / "chat.jsonl"
    write(model, llama.Config(n_ctx=128, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64),
          key_overrides={"tokenizer.chat_template": (template, V.STRING)})
    chat.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        for q, a in [("Hi?", "Yes."), ("Copy?", "Verbatim."), ("Who?", "All.")] * 6) + "\n")
    for n in (1, 2):
        code, out = run(n, "-m", "ggopt.examples.finetune", "--model", str(model), "--out",
                        str(tmp_path / f"ft{n}.gguf"), "--chat", str(chat), "--chat-pack",
                        "--ctx", "128", "--batch", "2", "--lr", "1e-3", "--val-split", "0.2",
                        "--epochs", "2", "--no-progress", "--threads", "1")
        assert code == 0, out
        assert "conversations packed into" in out, out
    assert (tmp_path / "ft1.gguf").read_bytes() == (tmp_path / "ft2.gguf").read_bytes()
