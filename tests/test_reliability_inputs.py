"""Inputs validated at the door (issue 21 rows 6, 8, 9, 13 and the LLM CLI's --lr default).

Optimizer values and schedule constants are checked in float32, the kernels' type, when they
are given; output paths before training; batch destinations before anything is copied.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
from _opt_fixture import get_test_opt_pars, make_ctx_data

import ggopt
from ggopt import opt
from ggopt.errors import DTypeError, InvalidValueError
from ggopt.examples import llm, mnist
from ggopt.examples.llm_train import TrainParams
from ggopt.io.atomic import atomic_path
from ggopt.io.paths import check_output_path
from ggopt.opt.params import AdamWParams, SGDParams, optimizer_step_values

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


# --- row 6: float32 values ------------------------------------------------------------------


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


@pytest.mark.parametrize("make, name", [
    (lambda: opt.warmup_cosine(1e300, 10), "lr0"),
    (lambda: opt.epoch_decay(1e-3, 1e-300), "decay_epochs"),
    (lambda: opt.epoch_decay(1e300, 1.0), "lr0"),
    (lambda: opt.constant(1e-50), "lr"),
    (lambda: opt.constant(1e-40), "lr"),
    (lambda: opt.epoch_decay(1e-3, 1.0, lr_min=1e-41), "lr_min"),
    (lambda: opt.warmup_cosine(1e-36, 1000, warmup=500), "learning rate of step 0"),
])
def test_schedule_constants_checked_in_float32(make, name):
    with pytest.raises(InvalidValueError, match=re.escape(name)):
        make()


def test_schedule_base_hyperparameters_checked_when_given():
    base = opt.OptimizerParams()
    base.adamw.wd = 5.0
    with pytest.raises(InvalidValueError, match=r"adamw\.wd"):
        opt.constant(1e-3, base)
    base.adamw.wd, base.adamw.eps = 0.0, 1e300
    with pytest.raises(InvalidValueError, match=r"adamw\.eps"):
        opt.warmup_cosine(1e-3, 10, base=base)


def test_schedule_check_run_covers_the_whole_run():
    opt.epoch_decay(1e-3, 1.0).check_run(30, 5, "here")  # 1e-3 / 2**29 is still normal
    with pytest.raises(InvalidValueError, match=r"\(epoch 200\) .*\(here\)"):
        opt.epoch_decay(1e-3, 1.0).check_run(200, 5, "here")  # 1e-3 / 2**199 flushes
    opt.warmup_cosine(1e-3, 10).check_run(2, 5, "here")
    with pytest.raises(InvalidValueError, match=r"step 20 \(epoch 2\)"):
        opt.warmup_cosine(1e-3, 10).check_run(2, 10, "here")  # past total_steps: lr_min = 0


@pytest.mark.parametrize("make, name", [
    (lambda: AdamWParams(alpha=1e300), "adamw.alpha"),
    (lambda: AdamWParams(alpha=1e-50), "adamw.alpha"),
    (lambda: AdamWParams(beta1=math.nan), "adamw.beta1"),
    (lambda: AdamWParams(beta2=1.5), "adamw.beta2"),
    (lambda: AdamWParams(eps=1e-45), "adamw.eps"),
    (lambda: AdamWParams(wd=-0.1), "adamw.wd"),
    (lambda: SGDParams(alpha=math.inf), "sgd.alpha"),
    (lambda: SGDParams(wd=1e-39), "sgd.wd"),
])
def test_optimizer_params_checked_in_float32_when_constructed(make, name):
    with pytest.raises(InvalidValueError, match=re.escape(name)):
        make()


def test_optimizer_params_wrong_types_when_constructed():
    with pytest.raises(DTypeError, match=r"adamw\.alpha"):
        AdamWParams(alpha="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("field, value", [("alpha", 1e300), ("alpha", 1e-40), ("eps", 1e39),
                                          ("wd", 1e-42)])
def test_step_values_outside_float32_are_refused(field, value):
    pars = opt.OptimizerParams()
    setattr(pars.adamw, field, value)
    with pytest.raises(InvalidValueError, match=rf"adamw\.{field}"):
        optimizer_step_values(pars, opt.OptimizerType.ADAMW, 1)
    pars = opt.OptimizerParams()
    if field in ("alpha", "wd"):
        setattr(pars.sgd, field, value)
        with pytest.raises(InvalidValueError, match=rf"sgd\.{field}"):
            optimizer_step_values(pars, opt.OptimizerType.SGD, 1)


def test_llm_train_params_checked_in_float32():
    with pytest.raises(InvalidValueError, match="lr"):
        TrainParams(lr=1e300).check()
    with pytest.raises(InvalidValueError, match="wd"):
        TrainParams(wd=1e-42).check()
    with pytest.raises(InvalidValueError, match="val_split"):
        TrainParams(val_split=1.0).check()


def test_fit_refuses_a_schedule_that_reaches_zero_before_training():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    w = cd.w
    with pytest.raises(InvalidValueError, match="learning rate of optimizer step"):
        opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised,
                opt.LossType.SUM, opt.OptimizerType.ADAMW, opt.epoch_decay(1.0, 1e-30), 3, 1,
                0.0, True)
    assert cd.w == w


# --- rows 8 and 9: output paths -------------------------------------------------------------


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


@pytest.mark.parametrize("checkpoint, message", [("", "empty"), (".", "is a directory"),
                                                 ("nodir/ck.gguf", "does not exist")])
def test_fit_checks_the_checkpoint_path_before_training(checkpoint, message, tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    w = cd.w
    with pytest.raises(InvalidValueError, match=f"checkpoint .*{message}"):
        opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised,
                opt.LossType.SUM, opt.OptimizerType.SGD, get_test_opt_pars, 2, 1, 0.0, True,
                checkpoint=checkpoint)
    assert cd.w == w
    assert os.listdir(tmp_path) == []


def test_every_writer_refuses_a_directory_with_a_ggopt_error(tmp_path):
    with pytest.raises(InvalidValueError, match="is a directory"):
        with atomic_path(tmp_path):
            pass
    with pytest.raises(InvalidValueError, match="does not exist"):
        with atomic_path(tmp_path / "nodir" / "f.bin"):
            pass
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(InvalidValueError, match="not writable"):
            check_output_path(ro / "f.gguf", "--out")
    finally:
        ro.chmod(0o700)


def test_output_path_that_is_not_a_regular_file_is_refused():
    with pytest.raises(InvalidValueError, match="not a regular file"):
        check_output_path("/dev/null", "--out")
    with pytest.raises(DTypeError, match="--out"):
        check_output_path(3, "--out")


# --- row 13: batch destinations -------------------------------------------------------------


def _dataset() -> opt.Dataset:
    ds = opt.Dataset(ggopt.F32, ggopt.F32, 4, 2, 8, 1)
    ds.data.numpy()[:] = np.arange(32, dtype=np.float32).reshape(8, 4)
    ds.labels.numpy()[:] = np.arange(16, dtype=np.float32).reshape(8, 2)
    return ds


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself
def test_get_batch_host_refuses_a_matrix():
    ds = _dataset()
    with pytest.raises(DTypeError, match="matrix"):
        ds.get_batch_host(np.asmatrix(np.zeros((2, 4), np.float32)),
                          np.zeros((2, 2), np.float32), 0)


def test_get_batch_host_refuses_destinations_in_the_datasets_storage():
    ds = _dataset()
    data, labels = ds.data.numpy().copy(), ds.labels.numpy().copy()
    with pytest.raises(InvalidValueError, match="data_arr shares memory with the dataset's data"):
        ds.get_batch_host(ds.data.numpy()[4:6], np.zeros((2, 2), np.float32), 0)
    with pytest.raises(InvalidValueError, match="labels_arr shares memory with the dataset's "
                                                "data"):
        ds.get_batch_host(np.zeros((2, 4), np.float32), ds.data.numpy()[6, :].reshape(2, 2), 0)
    with pytest.raises(InvalidValueError, match="labels"):
        ds.get_batch_host(np.zeros((2, 4), np.float32), ds.labels.numpy()[2:4], 0)
    both = np.zeros(12, np.float32)
    with pytest.raises(InvalidValueError, match="data_arr and labels_arr share memory"):
        ds.get_batch_host(both[:8].reshape(2, 4), both[6:10].reshape(2, 2), 0)
    np.testing.assert_array_equal(ds.data.numpy(), data)
    np.testing.assert_array_equal(ds.labels.numpy(), labels)
    out_d, out_l = np.zeros((2, 4), np.float32), np.zeros((2, 2), np.float32)
    ds.get_batch_host(out_d, out_l, 1)  # separate arrays: fine
    np.testing.assert_array_equal(out_d, data[2:4])


# --- the LLM CLI's --lr default ------------------------------------------------------------


def test_llm_cli_states_the_lr_that_runs(capsys):
    with pytest.raises(SystemExit):
        llm.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    runs = TrainParams().lr
    parsed = llm._parser().parse_args(["train"])
    assert parsed.lr == runs
    assert f"--lr {runs:g} by default here" in text
    assert f"default {runs:g})" in text
