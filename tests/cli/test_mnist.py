"""The MNIST example on the bundled subset: data loading, models, GGUF files and the CLI."""

from __future__ import annotations

import gzip
import io
import math
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

import ggopt
from ggopt import opt
from ggopt.cli import mnist
from ggopt.errors import DTypeError, InvalidValueError, ShapeError
from ggopt.io import gguf, idx
from ggopt.models.mnist import data as mnist_data
from ggopt.models.mnist import model as mnist_model

# ggml's tensor names and shapes in ggml order (ne0 first), as mnist-eval loads them.
GGML_SHAPES = {
    "mnist-fc": {"fc1.weight": [784, 500], "fc1.bias": [500], "fc2.weight": [500, 10],
                 "fc2.bias": [10]},
    "mnist-cnn": {"conv1.kernel": [3, 3, 1, 8], "conv1.bias": [1, 1, 8],
                  "conv2.kernel": [3, 3, 8, 16], "conv2.bias": [1, 1, 16],
                  "dense.weight": [784, 10], "dense.bias": [10]},
}
BUNDLED = resources.files("ggopt.models.mnist") / "subset"
LOSS_RE = re.compile(r"^main: test_loss=(\d+\.\d{6})\+-(\d+\.\d{6})$", re.M)
ACC_RE = re.compile(r"^main: test_acc=(\d+\.\d{2})\+-(\d+\.\d{2})%$", re.M)


@pytest.fixture(autouse=True)
def _default_threads():
    yield
    ggopt.set_n_threads(None)  # --threads changes the process-wide setting


def run(*argv: object) -> tuple[int, str, str]:
    """``mnist.main(argv)`` with stdout and stderr captured: ``(exit code, out, err)``."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = mnist.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def results(out: str) -> tuple[str, str]:
    """The test loss and accuracy lines' numbers, as printed."""
    loss, acc = LOSS_RE.findall(out), ACC_RE.findall(out)
    assert len(loss) == 1 and len(acc) == 1, out
    return loss[0], acc[0]


@pytest.fixture(scope="module", params=["fc", "cnn"])
def trained(request, tmp_path_factory):
    """One epoch of ``train --arch <arch>`` on the bundled subset."""
    path = tmp_path_factory.mktemp("mnist") / f"{request.param}.gguf"
    rc, out, err = run("train", "--arch", request.param, "--epochs", 1, "--out", path)
    return request.param, path, rc, out, err


# --- data -----------------------------------------------------------------------------------


def test_load_bundled_subset():
    data = mnist_data.load_mnist()
    assert data.train_images.shape == (4000, 784) and data.test_images.shape == (1000, 784)
    assert data.train_labels.shape == (4000, 10) and data.test_labels.shape == (1000, 10)
    for arr in (data.train_images, data.train_labels, data.test_images, data.test_labels):
        assert arr.dtype == np.float32
    with resources.as_file(BUNDLED / "train-images-idx3-ubyte.gz") as p:
        raw = idx.read(p)
    np.testing.assert_array_equal(data.train_images[:7],
                                  raw[:7].reshape(7, 784).astype(np.float32) / np.float32(255))
    assert data.train_images.min() == 0.0 and data.train_images.max() == 1.0
    np.testing.assert_array_equal(data.train_labels.sum(axis=1), 1.0)
    # digit counts from the subset's README
    np.testing.assert_array_equal(data.train_labels.sum(axis=0),
                                  [379, 444, 397, 392, 430, 350, 405, 433, 373, 397])
    np.testing.assert_array_equal(data.test_labels.sum(axis=0),
                                  [85, 126, 116, 107, 110, 87, 87, 99, 89, 94])


def _copy_bundled(dst: Path, raw: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
    """The bundled files into ``dst``: names in ``raw`` decompressed, those in ``skip`` left out."""
    for name in mnist_data.FILES.values():
        if name in skip:
            continue
        with resources.as_file(BUNDLED / f"{name}.gz") as src:
            if name in raw:
                (dst / name).write_bytes(gzip.decompress(src.read_bytes()))
            else:
                shutil.copyfile(src, dst / f"{name}.gz")


def test_load_directory_with_raw_and_gz_files(tmp_path):
    _copy_bundled(tmp_path, raw=("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
    got, ref = mnist_data.load_mnist(tmp_path), mnist_data.load_mnist()
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field))
    assert got.source == str(tmp_path)


def test_missing_file_is_named(tmp_path):
    _copy_bundled(tmp_path, skip=("t10k-labels-idx1-ubyte",))
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte or .*\\.gz"):
        mnist_data.load_mnist(tmp_path)
    rc, out, err = run("train", "--arch", "fc", "--data", tmp_path, "--out",
                       tmp_path / "m.gguf")
    assert rc == 1 and "t10k-labels-idx1-ubyte" in err
    assert not (tmp_path / "m.gguf").exists()


def test_missing_directory_or_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="data directory not found"):
        mnist_data.load_mnist(tmp_path / "nope")
    rc, _, err = run("train", "--arch", "fc", "--data", tmp_path / "nope")
    assert rc == 1 and f"data directory not found: {tmp_path / 'nope'}" in err
    rc, _, err = run("eval", "--model", tmp_path / "x.gguf")
    assert rc == 1 and "x.gguf" in err


def test_labels_out_of_range(tmp_path):
    _copy_bundled(tmp_path)
    idx.write(tmp_path / "t10k-labels-idx1-ubyte.gz", np.full(1000, 10, dtype=np.uint8))
    with pytest.raises(InvalidValueError, match="digits 0..9, got 10"):
        mnist_data.load_split(tmp_path, "test")


def test_make_dataset_uses_whole_batches():
    data = mnist_data.load_mnist()
    note = io.StringIO()
    ds = mnist_data.make_dataset(data.train_images[:3500], data.train_labels[:3500], 10, 1000,
                                 stream=note)
    assert ds.ndata == 3000 and ds.ndata_shard == 10
    assert "using 3000 of 3500 images" in note.getvalue()
    np.testing.assert_array_equal(ds.data.numpy(), data.train_images[:3000])
    np.testing.assert_array_equal(ds.labels.numpy(), data.train_labels[:3000])
    with pytest.raises(ShapeError, match="at least 1000 images"):
        mnist_data.make_dataset(data.train_images[:999], data.train_labels[:999], 10, 1000)


def test_image_ascii():
    image = np.zeros(784, dtype=np.float32)
    image[0], image[1], image[783] = 1.0, 10 / 255, 9 / 255
    lines = mnist_data.image_ascii(image).splitlines()
    assert len(lines) == 28 and all(len(line) == 28 for line in lines)
    assert lines[0][:3] == "█░ " and lines[27][27] == " "


# --- models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mnist-fc", "mnist-cnn"])
def test_build_model_ggml_shapes(arch):
    m = mnist_model.build_model(arch, mnist_model.make_scheduler())
    assert list(m.params) == list(GGML_SHAPES[arch])
    for name, ne in GGML_SHAPES[arch].items():
        t = m.params[name]
        assert t.name == name and list(t.ne[:len(ne)]) == ne and t.type is ggopt.F32
        assert t.flags & ggopt.TensorFlag.PARAM
    assert m.images.ne == (784, 500, 1, 1) and m.images.flags & ggopt.TensorFlag.INPUT
    assert m.logits.ne == (10, 500, 1, 1) and m.logits.name == "logits"
    assert sum(t.nelements() for t in m.params.values()) == (
        397510 if arch == "mnist-fc" else 9098)


def test_init_params_seeded():
    sched = mnist_model.make_scheduler()
    a, b, c = (mnist_model.build_model("mnist-fc", sched) for _ in range(3))
    mnist_model.init_params(a, 7)
    mnist_model.init_params(b, 7)
    mnist_model.init_params(c, 8)
    wa, wb, wc = (mnist_model.get_params(m) for m in (a, b, c))
    for name in wa:
        np.testing.assert_array_equal(wa[name], wb[name])
        assert not np.array_equal(wa[name], wc[name])
    assert abs(float(wa["fc1.weight"].std()) - 0.01) < 1e-4
    assert abs(float(wa["fc1.weight"].mean())) < 1e-4


def test_set_params_checks_everything_first():
    m = mnist_model.build_model("mnist-fc", mnist_model.make_scheduler())
    mnist_model.init_params(m, 0)
    before = mnist_model.get_params(m)
    bad = {name: np.zeros_like(w) for name, w in before.items()}
    bad["fc2.weight"] = np.zeros((500, 10), np.float32)  # transposed
    with pytest.raises(ShapeError, match=r"'fc2.weight': expected ggml shape \[500, 10\], "
                                         r"got \[10, 500\]"):
        mnist_model.set_params(m, bad)
    del bad["fc2.weight"]
    with pytest.raises(ShapeError, match=r"missing \['fc2.weight'\]"):
        mnist_model.set_params(m, bad)
    bad["fc2.weight"] = np.zeros((10, 500), np.float64)
    with pytest.raises(DTypeError, match="float32"):
        mnist_model.set_params(m, bad)
    for name, w in mnist_model.get_params(m).items():
        np.testing.assert_array_equal(w, before[name])


def test_unknown_architecture():
    with pytest.raises(InvalidValueError, match="mnist-fc, mnist-cnn"):
        mnist_model.build_model("mnist-rnn", mnist_model.make_scheduler())
    with pytest.raises(InvalidValueError, match="'cpu' or 'cupy'"):
        mnist_model.make_scheduler("tpu")


# --- GGUF files -----------------------------------------------------------------------------


def _fc_weights() -> dict[str, np.ndarray]:
    return {name: np.zeros(shape, np.float32)
            for name, shape in mnist_model.PARAM_SHAPES["mnist-fc"].items()}


def test_load_gguf_wrong_architecture(tmp_path):
    path = tmp_path / "rnn.gguf"
    gguf.save(path, _fc_weights(), {"general.architecture": "mnist-rnn"})
    with pytest.raises(InvalidValueError,
                       match="expected one of mnist-fc, mnist-cnn, got 'mnist-rnn'"):
        mnist_model.load_gguf(path)
    rc, out, err = run("eval", "--model", path)
    assert rc == 1 and "mnist-rnn" in err and "test_acc" not in out


def test_load_gguf_wrong_tensors(tmp_path):
    weights = _fc_weights()
    weights["fc1.weight"] = np.zeros((784, 500), np.float32)  # NumPy order not reversed
    gguf.save(tmp_path / "shape.gguf", weights, {"general.architecture": "mnist-fc"})
    with pytest.raises(ShapeError, match=r"'fc1.weight': expected ggml shape \[784, 500\]"):
        mnist_model.load_gguf(tmp_path / "shape.gguf")
    # a CNN file that claims to be an FC model
    cnn = {name: np.zeros(s, np.float32)
           for name, s in mnist_model.PARAM_SHAPES["mnist-cnn"].items()}
    gguf.save(tmp_path / "mixed.gguf", cnn, {"general.architecture": "mnist-fc"})
    with pytest.raises(ShapeError, match="missing .*fc1.weight.*unknown .*conv1.kernel"):
        mnist_model.load_gguf(tmp_path / "mixed.gguf")
    weights = _fc_weights()
    weights["fc2.bias"] = weights["fc2.bias"].astype(np.float16)
    gguf.save(tmp_path / "f16.gguf", weights, {"general.architecture": "mnist-fc"})
    with pytest.raises(DTypeError, match="'fc2.bias': expected float32, got float16"):
        mnist_model.load_gguf(tmp_path / "f16.gguf")


# --- command line ---------------------------------------------------------------------------


def test_train_writes_ggml_gguf(trained):
    arch, path, rc, out, err = trained
    assert rc == 0, err
    assert "ggml_opt_fit: epoch 0001/0001:" in err and "ggml_opt_fit: training took" in err
    assert f"saving model to '{path}'" in out
    loss, acc = results(out)
    assert 0 < float(loss[0]) < 3 and 0 <= float(acc[0]) <= 100
    if arch == "fc":  # three optimizer steps; the CNN starts slowly from N(0, 0.01) (spec 8.5)
        assert float(loss[0]) < math.log(10) - 0.1 and float(acc[0]) > 50
    reader = GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == f"mnist-{arch}"
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    assert shapes == GGML_SHAPES[f"mnist-{arch}"]
    assert all(t.tensor_type == GGMLQuantizationType.F32 for t in reader.tensors)


def numpy_logits(arch: str, weights: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    """The model's logits computed in float64 NumPy from the GGUF weights (NumPy order)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    x = images.astype(np.float64)
    if arch == "fc":
        h = np.maximum(x @ w["fc1.weight"].T + w["fc1.bias"], 0)
        return h @ w["fc2.weight"].T + w["fc2.bias"]
    x = x.reshape(-1, 1, 28, 28)  # (image, channel, row, column)
    for i in (1, 2):
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
        x = np.einsum("ncyxij,ocij->noyx", windows, w[f"conv{i}.kernel"], optimize=True)
        x = np.maximum(x + w[f"conv{i}.bias"], 0)
        n, c, h, wd = x.shape
        x = x.reshape(n, c, h // 2, 2, wd // 2, 2).max(axis=(3, 5))
    dense_in = x.transpose(0, 2, 3, 1).reshape(len(x), -1)  # channel fastest, as ggml's model
    return dense_in @ w["dense.weight"].T + w["dense.bias"]


def test_eval_reproduces_training_result(trained):
    arch, path, _, train_out, _ = trained
    rc, out, err = run("eval", "--model", path, "--seed", 3)
    assert rc == 0, err
    assert f"model arch is mnist-{arch}" in err
    assert results(out) == results(train_out)
    lines = out.splitlines()
    data = mnist_data.load_mnist()
    iex = int(np.random.default_rng(3).integers(1000))
    assert "\n".join(lines[:28]) + "\n" == mnist_data.image_ascii(data.test_images[iex])
    # the prediction, loss and accuracy against the model computed independently in NumPy
    logits = numpy_logits(arch, gguf.load(path)[1], data.test_images)
    pred = logits.argmax(axis=1)
    assert lines[28] == f"main: predicted digit is {pred[iex]}"
    labels = data.test_labels.argmax(axis=1)
    shifted = logits - logits.max(axis=1, keepdims=True)
    ce = -(shifted[np.arange(1000), labels] - np.log(np.exp(shifted).sum(axis=1)))
    batch_loss = ce.reshape(2, 500).mean(axis=1)  # eval runs physical batches of 500, in order
    (loss, loss_unc), (acc, acc_unc) = results(out)
    assert float(loss) == pytest.approx(ce.mean(), rel=1e-4)
    # ggml squares the float32 batch losses in float32: var = mean(l*l) - mean(l)^2 then carries
    # an absolute error up to 2^-23 * mean(l*l), i.e. the uncertainty up to the square root of it
    float32_squares = np.sqrt(2.0**-23 * np.mean(batch_loss**2))
    assert float(loss_unc) == pytest.approx(batch_loss.std(ddof=1) / np.sqrt(2),
                                            abs=float32_squares + 1e-6)
    hits = pred == labels
    # a near-tie may round the other way in float32: allow one image in 1000
    assert abs(float(acc) - 100 * hits.mean()) <= 0.1 + 1e-9
    assert float(acc_unc) == pytest.approx(100 * hits.std(ddof=1) / np.sqrt(1000), abs=0.01)


def test_train_is_reproducible(trained, tmp_path):
    """The same seed gives bit-identical weights (tests/backend/test_determinism.py varies
    threads)."""
    arch, path, _, train_out, _ = trained
    rc, out, _ = run("train", "--arch", arch, "--epochs", 1, "--out", tmp_path / "again.gguf")
    assert rc == 0 and results(out) == results(train_out)
    _, first = gguf.load(path)
    _, again = gguf.load(tmp_path / "again.gguf")
    for name, w in first.items():
        np.testing.assert_array_equal(again[name], w)


def test_entry_point_subprocess(trained):
    arch, path, _, train_out, _ = trained
    proc = subprocess.run(
        [sys.executable, "-m", "ggopt.examples.mnist", "eval", "--model", str(path)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert results(proc.stdout) == results(train_out)


def test_cnn_learns():
    """16 AdamW steps (alpha 0.01, batches of 500) from He-normal weights take the CNN's test
    loss to less than half of chance (ln 10) and its accuracy far above 10 %. (ggml's own
    N(0, 0.01) start stays at chance for several epochs; spec 8.5.)"""
    data = mnist_data.load_mnist()
    train = mnist_data.make_dataset(data.train_images, data.train_labels, 10, 500)
    test = mnist_data.make_dataset(data.test_images, data.test_labels, 10, 500)
    m = mnist_model.build_model("mnist-cnn", mnist_model.make_scheduler("cpu"))
    mnist_model.init_params(m, seed=0, scheme="he")

    def pars(epoch):
        p = opt.get_default_optimizer_params(epoch)
        p.adamw.alpha = 0.01
        return p

    history = opt.fit(m.sched, m.ctx_compute, m.images, m.logits, train,
                      opt.LossType.CROSS_ENTROPY, opt.OptimizerType.ADAMW, pars, 2, 500, 0.0, True)
    assert history.train_loss[1] < history.train_loss[0]
    result = mnist_model.evaluate(m, test)
    loss, _ = result.loss()
    acc, _ = result.accuracy()
    assert loss < 0.5 * math.log(10), f"test loss {loss:.3f}: the CNN did not learn"
    assert acc > 0.7


def test_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from matplotlib import image

    png = tmp_path / "curves.png"
    rc, out, err = run("train", "--arch", "fc", "--epochs", 2, "--threads", 1,
                       "--out", tmp_path / "m.gguf", "--plot", png)
    assert rc == 0, err
    assert f"wrote {png}" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000, "a PNG this small holds no curves"
    pixels = image.imread(png)[..., :3]
    assert pixels.shape[:2] == (400, 1000)  # figsize (10, 4) at 100 dpi
    ink = pixels.mean(axis=2) < 0.9  # not white: axes, text, curves, grid
    assert 0.01 < ink.mean() < 0.5
    assert pixels.std() > 0.05
    # both panels have drawing in them, and some of it is coloured (the curves)
    assert ink[:, :500].mean() > 0.01 and ink[:, 500:].mean() > 0.01
    assert (np.ptp(pixels, axis=2) > 0.3).sum() > 100


def test_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail
    rc, _, err = run("train", "--arch", "fc", "--out", tmp_path / "m.gguf", "--plot",
                     tmp_path / "c.png")
    assert rc == 1 and "matplotlib" in err and "ggopt[plot]" in err
    assert not (tmp_path / "m.gguf").exists()  # failed before training


def test_device_unavailable(monkeypatch, tmp_path):
    def no_gpu(device: int = 0):
        raise ggopt.BackendUnavailableError("no CUDA device")

    monkeypatch.setattr(mnist_model, "cupy_init", no_gpu)
    rc, _, err = run("train", "--arch", "fc", "--device", "cupy", "--out", tmp_path / "m.gguf")
    assert rc == 2 and "device 'cupy' unavailable: no CUDA device" in err


@pytest.mark.parametrize("argv", [
    ["train", "--arch", "rnn"],
    ["train", "--arch", "fc", "--epochs", "0"],
    ["train", "--arch", "fc", "--threads", "-1"],
    ["eval"],
])
def test_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        mnist.main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_he_init_scales_by_fan_in_and_zeroes_biases():
    m = mnist_model.build_model("mnist-cnn", mnist_model.make_scheduler("cpu"))
    mnist_model.init_params(m, seed=1, scheme="he")
    p = mnist_model.get_params(m)
    for name, w in p.items():
        if name.endswith(".bias"):
            assert not w.any(), name
        else:
            want = np.sqrt(2.0 / np.prod(w.shape[1:]))
            assert abs(w.std() / want - 1) < 0.2, name
    mnist_model.init_params(m, seed=1)  # ggml's N(0, 0.01), biases included
    assert all(abs(w.std() / 0.01 - 1) < 0.2 for w in mnist_model.get_params(m).values()
               if w.size > 50)
    before = mnist_model.get_params(m)
    with pytest.raises(InvalidValueError, match="scheme"):
        mnist_model.init_params(m, scheme="xavier")
    after = mnist_model.get_params(m)
    assert all(np.array_equal(before[k], after[k]) for k in before)
