"""Checkpoints: save_state/load_state, bit-exact resume (static and dynamic graphs, AdamW and
SGD), kills mid-epoch and mid-save (subprocesses), and bad files that change nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ggopt
from ggopt import opt
from ggopt.backend import tensor_get
from ggopt.errors import DTypeError, GgoptError, InvalidValueError, ShapeError, StateError
from ggopt.io import gguf
from ggopt.models.mnist import model as mnist_model
from ggopt.opt import checkpoint, checkpoint_file
from ggopt.opt.rng import Mt19937
from tests.support import ckpt as h

ROOT = Path(__file__).resolve().parents[2]


# --- resume is exact -----------------------------------------------------------------------
@pytest.mark.parametrize("optimizer,kind", [
    (h.ADAMW, None), (h.ADAMW, "cosine"), (h.SGD, "decay"), (h.SGD, None),
])
def test_fit_resume_is_bit_exact(tmp_path, optimizer, kind):
    straight = h.weights_gguf(h.fit_run(3, optimizer, h.schedule(kind)), tmp_path / "a.gguf")
    ckpt = tmp_path / "state.gguf"
    h.fit_run(1, optimizer, h.schedule(kind), checkpoint=ckpt)
    assert gguf.load(ckpt)[0]["ggopt.state.epoch"] == 1
    resumed = h.fit_run(3, optimizer, h.schedule(kind), checkpoint=ckpt, resume=True)
    assert h.weights_gguf(resumed, tmp_path / "b.gguf") == straight
    assert gguf.load(ckpt)[0]["ggopt.state.epoch"] == 3
    one_epoch = h.weights_gguf(h.fit_run(1, optimizer, h.schedule(kind)), tmp_path / "c.gguf")
    assert one_epoch != straight  # the resumed run did train


@pytest.mark.parametrize("optimizer,kind", [(h.ADAMW, "cosine"), (h.SGD, None)])
def test_dynamic_graphs_resume_is_bit_exact(tmp_path, optimizer, kind):
    straight = h.weights_gguf(h.dynamic_run(3, optimizer, h.schedule(kind)), tmp_path / "a.gguf")
    ckpt = tmp_path / "state.gguf"
    h.dynamic_run(1, optimizer, h.schedule(kind), checkpoint=ckpt)
    resumed = h.dynamic_run(3, optimizer, h.schedule(kind), checkpoint=ckpt, resume=True)
    assert h.weights_gguf(resumed, tmp_path / "b.gguf") == straight


def test_dynamic_and_static_graphs_read_each_others_checkpoints(tmp_path):
    # A checkpoint written by fit (static graphs) continues in a dynamic-graph loop.
    straight = h.weights_gguf(h.dynamic_run(2, h.ADAMW), tmp_path / "a.gguf")
    ckpt = tmp_path / "state.gguf"
    h.fit_run(1, h.ADAMW, checkpoint=ckpt)
    resumed = h.dynamic_run(2, h.ADAMW, checkpoint=ckpt, resume=True)
    assert h.weights_gguf(resumed, tmp_path / "b.gguf") == straight


def _static_context(m, optimizer=h.ADAMW, opt_period=2, sched=None):
    params = opt.default_params(m.sched, h.CE)
    params.ctx_compute, params.inputs, params.outputs = m.ctx_compute, m.images, m.logits
    params.opt_period, params.optimizer = opt_period, optimizer
    if sched is not None:
        params.get_opt_pars = sched
    return opt.OptContext(params)


def _static_steps(ctx, m, ds, batches):
    for ibatch in batches:
        ds.get_batch(m.images, ctx.labels, ibatch)
        ctx.alloc(True)
        ctx.eval(None)


@pytest.mark.parametrize("dynamic", [False, True])
def test_resume_inside_an_accumulation_period(tmp_path, dynamic):
    # 3 backward evals with opt_period 2: the state holds half a period of gradients.
    def steps(ctx, m, ds, batches):
        for ib in batches:
            if dynamic:
                h.dynamic_step(ctx, m, ds, ib)
            else:
                _static_steps(ctx, m, ds, [ib])

    def context(m):
        return h.dynamic_context(m, h.ADAMW) if dynamic else _static_context(m)

    m, ds = h.model(), h.dataset()
    with context(m) as ctx:
        steps(ctx, m, ds, range(6))
    straight = h.param_bytes(m.params)

    ckpt = tmp_path / "mid.gguf"
    m, ds = h.model(), h.dataset()
    with context(m) as ctx:
        steps(ctx, m, ds, range(3))
        assert ctx.state().counters.opt_i == 1
        ctx.save_state(ckpt, ds, epoch=7)
    acc = gguf.load(ckpt)[1]["ggopt.grad_acc.0"]
    assert np.any(acc != 0)

    m, ds = h.model(), h.dataset()
    with context(m) as ctx:
        assert ctx.load_state(ckpt, ds) == 7
        # dynamic graphs: the counters wait for the first alloc
        assert ctx.state().counters.opt_i == 1 or dynamic
        steps(ctx, m, ds, range(3, 6))
    assert h.param_bytes(m.params) == straight


# --- kills (subprocesses) ------------------------------------------------------------------
def _child(script: str, *args: object) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


_KILL_MID_EPOCH = """
    import os, signal, sys
    from tests.support import ckpt as h
    from ggopt import opt

    class KillInEpoch2(opt.ConstantLR):  # the constant schedule, until step 2 of epoch 2
        def lr_at(self, step, epoch):
            if epoch == 1 and step == h.STEPS_PER_EPOCH + 1:
                assert os.path.exists(sys.argv[1])
                os.kill(os.getpid(), signal.SIGKILL)
            return super().lr_at(step, epoch)

    sched = KillInEpoch2(2e-3)
    if sys.argv[2] == "dynamic":
        h.dynamic_run(3, h.ADAMW, sched, checkpoint=sys.argv[1])
    else:
        h.fit_run(3, h.ADAMW, sched, checkpoint=sys.argv[1])
"""


@pytest.mark.parametrize("graphs", ["static", "dynamic"])
def test_sigkill_mid_epoch_then_resume_is_bit_exact(tmp_path, graphs):
    run = h.dynamic_run if graphs == "dynamic" else h.fit_run
    ckpt = tmp_path / "state.gguf"
    proc = _child(_KILL_MID_EPOCH, ckpt, graphs)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert gguf.load(ckpt)[0]["ggopt.state.epoch"] == 1
    resumed = run(3, h.ADAMW, h.schedule("constant"), checkpoint=ckpt, resume=True)
    straight = run(3, h.ADAMW, h.schedule("constant"))
    assert h.weights_gguf(resumed, tmp_path / "b.gguf") == h.weights_gguf(straight,
                                                                          tmp_path / "a.gguf")


_KILL_IN_SAVE = """
    import os, signal, sys
    from tests.support import ckpt as h

    real_replace, calls = os.replace, []

    def replace(src, dst):  # the second save dies after writing, before renaming
        calls.append(dst)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    os.replace = replace
    h.fit_run(3, h.ADAMW, checkpoint=sys.argv[1])
"""


def _temporaries(path: Path) -> list[Path]:
    """The temporary files ggopt.io.atomic writes beside ``path``."""
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def test_sigkill_between_write_and_rename_keeps_previous_checkpoint(tmp_path):
    ckpt = tmp_path / "state.gguf"
    proc = _child(_KILL_IN_SAVE, ckpt)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(_temporaries(ckpt)) == 1  # the unfinished epoch-2 save, never renamed
    clean = tmp_path / "clean.gguf"
    h.fit_run(1, h.ADAMW, checkpoint=clean)
    assert ckpt.read_bytes() == clean.read_bytes()
    resumed = h.fit_run(3, h.ADAMW, checkpoint=ckpt, resume=True)
    straight = h.fit_run(3, h.ADAMW)
    assert h.weights_gguf(resumed, tmp_path / "b.gguf") == h.weights_gguf(straight,
                                                                          tmp_path / "a.gguf")


def test_failed_write_leaves_previous_file_and_no_temp(tmp_path, monkeypatch):
    m, ds = h.model(), h.dataset()
    ckpt = tmp_path / "state.gguf"
    with _static_context(m) as ctx:
        ctx.save_state(ckpt, ds, epoch=1)
        before = ckpt.read_bytes()

        def fail(*args):
            raise OSError("disk full")

        monkeypatch.setattr(os, "replace", fail)
        with pytest.raises(OSError, match="disk full"):
            ctx.save_state(ckpt, ds, epoch=2)
    assert ckpt.read_bytes() == before
    assert _temporaries(ckpt) == []


# --- bad files change nothing --------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_state(tmp_path_factory):
    """A checkpoint saved mid-period (3 backward evals) with a dataset and a schedule."""
    path = tmp_path_factory.mktemp("ckpt") / "good.gguf"
    m, ds, sched = h.model(), h.dataset(), h.schedule("cosine")
    with _static_context(m, sched=sched) as ctx:
        ds.shuffle(ctx, -1)
        _static_steps(ctx, m, ds, range(3))
        ctx.save_state(path, ds, epoch=1)
    return path


@pytest.fixture
def fresh():
    """A context that trained 1 step differently from the checkpoint, with its own state."""
    m, ds, sched = h.model(), h.dataset(), h.schedule("cosine")
    ctx = _static_context(m, sched=sched)
    _static_steps(ctx, m, ds, [3, 2])
    yield ctx, ds, sched
    ctx.close()


def _rewrite(src: Path, dst: Path, meta=None, drop=(), tensors=None) -> Path:
    """``src`` changed and written with fresh checksums (checked past the checksums)."""
    metadata, arrays = gguf.load(src)
    metadata = {k: v for k, v in metadata.items() if not k.startswith("ggopt.checksum")}
    metadata.update(meta or {})
    arrays.update(tensors or {})
    for key in drop:
        metadata.pop(key, None)
        arrays.pop(key, None)
    checkpoint_file.write_file(dst, metadata, arrays)
    return dst


def _bad_files(good: Path, d: Path) -> dict[str, tuple[Path, type, str]]:
    data = good.read_bytes()
    files = {}
    for i, cut in enumerate((10, 200, len(data) // 2, len(data) - 1)):
        p = d / f"cut{i}.gguf"
        p.write_bytes(data[:cut])
        files[f"truncated at {cut}"] = (p, ShapeError, "gguf_init_from_file")
    (d / "empty.gguf").write_bytes(b"")
    files["empty"] = (d / "empty.gguf", ShapeError, "gguf_init_from_file")
    files["version"] = (_rewrite(good, d / "v3.gguf", {"ggopt.state.version": 3}), ShapeError,
                        "format version: expected 2, got 3")
    files["optimizer"] = (_rewrite(good, d / "sgd.gguf", {"ggopt.state.optimizer": "sgd"}),
                          ShapeError, "optimizer: the context has 'adamw', the file 'sgd'")
    files["opt_period"] = (_rewrite(good, d / "p4.gguf", {"ggopt.state.opt_period": 4}),
                           ShapeError, "opt_period: the context has 2, the file 4")
    files["build type"] = (_rewrite(good, d / "grad.gguf", {"ggopt.state.build_type": "GRAD"}),
                           ShapeError, "build type: the context has 'OPT', the file 'GRAD'")
    files["loss"] = (_rewrite(good, d / "mse.gguf", {"ggopt.state.loss_type": "MEAN"}),
                     ShapeError, "loss type: the context has 'CROSS_ENTROPY', the file 'MEAN'")
    files["opt_i"] = (_rewrite(good, d / "opti.gguf", {"ggopt.state.opt_i": 2}),
                      ShapeError, "opt_i: expected < opt_period=2, got 2")
    files["missing key"] = (_rewrite(good, d / "noiter.gguf", drop=["ggopt.state.iteration"]),
                            ShapeError, "metadata 'ggopt.state.iteration' is missing")
    files["shape"] = (_rewrite(good, d / "shape.gguf",
                               tensors={"fc2.bias": np.zeros(11, np.float32)}),
                      ShapeError, r"parameter 'fc2.bias': expected ggml shape \[10\]")
    files["dtype"] = (_rewrite(good, d / "dtype.gguf",
                               tensors={"fc2.bias": np.zeros(10, np.float16)}),
                      DTypeError, "parameter 'fc2.bias': expected F32")
    files["moment"] = (_rewrite(good, d / "nomoment.gguf", drop=["ggopt.adamw_v.3"]),
                       ShapeError, "'ggopt.adamw_v.3' .AdamW v of 'fc2.bias'. is missing")
    files["schedule"] = (_rewrite(good, d / "sched.gguf", {"ggopt.schedule.warmup": 3}),
                         InvalidValueError, "schedule warmup_cosine warmup: expected 2")
    files["no dataset"] = (_rewrite(good, d / "nods.gguf", drop=["ggopt.dataset.permutation"]),
                           ShapeError, "a dataset was given but the file holds no shard order")
    files["rng"] = (_rewrite(good, d / "rng.gguf", tensors={"ggopt.rng": np.zeros(5, np.int32)}),
                    ShapeError, "ggopt.rng")
    mnist_model.save_gguf(h.model(), d / "model.gguf")
    files["model file"] = (d / "model.gguf", ShapeError, "expected 'ggopt-state'")
    return files


def test_bad_files_raise_and_change_nothing(trained_state, fresh, tmp_path):
    ctx, ds, sched = fresh
    before = h.full_state(ctx, ds, sched)
    for what, (path, exc, match) in _bad_files(trained_state, tmp_path).items():
        with pytest.raises(GgoptError, match=match) as info:
            ctx.load_state(path, ds)
        assert isinstance(info.value, exc), what
        assert h.full_state(ctx, ds, sched) == before, what
    assert ctx.load_state(trained_state, ds) == 1  # and the good file loads
    assert h.full_state(ctx, ds, sched) != before


def test_other_model_and_optimizer_raise_and_change_nothing(trained_state, fresh, tmp_path):
    ctx, ds, sched = fresh
    before = h.full_state(ctx, ds, sched)
    sgd_file, cnn_file = tmp_path / "sgd.gguf", tmp_path / "cnn.gguf"
    m = h.model()
    with _static_context(m, optimizer=h.SGD, sched=h.schedule("cosine")) as other:
        other.save_state(sgd_file, ds)
    cnn = mnist_model.build_model("mnist-cnn", mnist_model.make_scheduler())
    with _static_context(cnn, sched=h.schedule("cosine")) as other:
        other.save_state(cnn_file, ds)
    with pytest.raises(ShapeError, match="optimizer: the context has 'adamw', the file 'sgd'"):
        ctx.load_state(sgd_file, ds)
    with pytest.raises(ShapeError, match="parameter 'fc2.weight' of the context is not in"):
        ctx.load_state(cnn_file, ds)
    with pytest.raises(ShapeError, match="expected 2 shards"):
        ctx.load_state(trained_state, opt.Dataset(ggopt.F32, ggopt.F32, 784, 10, 20, 10))
    with pytest.raises(ShapeError, match="the file holds a shard order but no dataset"):
        ctx.load_state(trained_state)
    with pytest.raises(InvalidValueError, match="schedule: expected 'constant'"):
        ctx.load_state(trained_state, ds, opt.constant(1e-3))
    with pytest.raises(FileNotFoundError):
        ctx.load_state(tmp_path / "missing.gguf", ds)
    assert h.full_state(ctx, ds, sched) == before


def test_dynamic_context_checks_parameters_at_first_alloc(trained_state, tmp_path):
    cnn_file = tmp_path / "cnn.gguf"
    cnn = mnist_model.build_model("mnist-cnn", mnist_model.make_scheduler())
    ds = h.dataset()
    with _static_context(cnn) as other:
        other.save_state(cnn_file, ds)
    m = h.model()
    with h.dynamic_context(m, h.ADAMW) as ctx:
        ctx.load_state(cnn_file, ds)  # parameters unknown yet: checked at the first alloc
        assert ctx.state().pending
        with pytest.raises(ShapeError, match="parameter 'fc2.weight' of the context"):
            h.dynamic_step(ctx, m, ds, 0)
        assert not ctx.state().built and ctx.state().counters.iteration == 1
    with h.dynamic_context(m, h.ADAMW) as ctx:  # after prepare_alloc: checked at once
        ctx_compute = ggopt.Context()
        logits = h._forward_fc(ctx_compute, m.params, m.images)
        gf = ggopt.new_graph_custom(ctx_compute, ggopt.GRAPH_DEFAULT_SIZE, True)
        ggopt.build_forward_expand(gf, logits)
        ctx.prepare_alloc(ctx_compute, gf, m.images, logits)
        with pytest.raises(ShapeError, match="parameter 'fc2.weight' of the context"):
            ctx.load_state(cnn_file, ds)
        assert not ctx.state().pending


def test_save_state_errors(tmp_path):
    m, ds = h.model(), h.dataset()
    path = tmp_path / "x.gguf"
    params = opt.default_params(m.sched, h.CE)
    params.ctx_compute, params.inputs, params.outputs = m.ctx_compute, m.images, m.logits
    params.build_type = opt.BuildType.FORWARD
    with opt.OptContext(params) as ctx, pytest.raises(StateError, match="FORWARD-only"):
        ctx.save_state(path)
    with h.dynamic_context(m, h.ADAMW) as ctx:
        with pytest.raises(StateError, match="before the first alloc"):
            ctx.save_state(path)
    with _static_context(m) as ctx:
        ds.get_batch(m.images, ctx.labels, 0)
        ctx.alloc(True)
        with pytest.raises(StateError, match="waiting for eval"):
            ctx.save_state(path)
        with pytest.raises(StateError, match="waiting for eval"):
            ctx.load_state(path)
        ctx.eval(None)
        with pytest.raises(InvalidValueError, match="epoch must be an int >= 0"):
            ctx.save_state(path, epoch=-1)
        with pytest.raises(DTypeError, match="dataset must be a Dataset"):
            ctx.save_state(path, dataset="data")
        with pytest.raises(DTypeError, match="schedule must be"):
            ctx.save_state(path, schedule=print)
        ctx.close()
        with pytest.raises(StateError, match="closed"):
            ctx.save_state(path)
    assert not path.exists()


def test_unnamed_parameters_cannot_be_checkpointed(tmp_path):
    m = h.model()
    ggopt.set_name(m.params["fc1.bias"], "fc1.weight")
    with _static_context(m) as ctx, pytest.raises(StateError, match="unique parameter names"):
        ctx.save_state(tmp_path / "x.gguf")


def test_file_layout(trained_state):
    metadata, tensors = gguf.load(trained_state)
    assert metadata["general.architecture"] == checkpoint.ARCHITECTURE
    assert metadata["ggopt.state.version"] == checkpoint.FORMAT_VERSION
    assert sorted(metadata["ggopt.state.params"]) == ["fc1.bias", "fc1.weight", "fc2.bias",
                                                      "fc2.weight"]
    assert (metadata["ggopt.state.iteration"], metadata["ggopt.state.opt_i"]) == (2, 1)
    assert metadata["ggopt.schedule.kind"] == "warmup_cosine"
    assert metadata["ggopt.schedule.step"] == 1
    assert tensors["fc1.weight"].shape == (500, 784)
    i = metadata["ggopt.state.params"].index("fc1.weight")
    assert tensors[f"ggopt.adamw_m.{i}"].shape == tensors[f"ggopt.grad_acc.{i}"].shape
    assert tensors[f"ggopt.adamw_m.{i}"].shape == (500, 784)
    assert sorted(tensors["ggopt.dataset.permutation"].tolist()) == list(range(400))


def test_fit_resume_after_the_last_epoch_trains_nothing(tmp_path):
    ckpt = tmp_path / "state.gguf"
    trained = h.weights_gguf(h.fit_run(2, h.ADAMW, checkpoint=ckpt), tmp_path / "a.gguf")
    m = h.model()
    history = opt.fit(m.sched, m.ctx_compute, m.images, m.logits, h.dataset(), h.CE, h.ADAMW,
                      opt.get_default_optimizer_params, 2, h.NBATCH_LOGICAL, h.VAL_SPLIT, True,
                      checkpoint=ckpt, resume=True)
    assert len(history) == 0
    assert h.weights_gguf(m, tmp_path / "b.gguf") == trained


def test_fit_resume_needs_checkpoint():
    m = h.model()
    with pytest.raises(StateError, match="resume=True needs a checkpoint"):
        opt.fit(m.sched, m.ctx_compute, m.images, m.logits, h.dataset(), h.CE,
                h.ADAMW, opt.get_default_optimizer_params, 1, 1000, 0.05, True, resume=True)


def test_rng_state_round_trip():
    rng = Mt19937()
    for _ in range(1000):
        rng()
    state = rng.get_state()
    expected = [rng() for _ in range(1500)]
    other = Mt19937(7)
    other.set_state(state)
    assert [other() for _ in range(1500)] == expected
    for bad in (state[:10], state.astype(np.int64), np.concatenate([state, [1]]).astype(np.uint32)):
        with pytest.raises(ShapeError, match="mt19937 state"):
            other.set_state(bad)


def test_loaded_weights_equal_saved(trained_state):
    _, tensors = gguf.load(trained_state)
    m, ds = h.model(), h.dataset()
    with _static_context(m, sched=h.schedule("cosine")) as ctx:
        ctx.load_state(trained_state, ds)
        for name, t in m.params.items():
            assert tensor_get(t).tobytes() == tensors[name].tobytes()
