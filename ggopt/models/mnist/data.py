"""MNIST data for the example: IDX files in, ggopt datasets out (ggml ``mnist-common.cpp``).

Pixels become ``uint8 / 255`` float32 in ``[0, 1]`` (no mean/std normalisation) and labels
one-hot float32 vectors of 10, as ggml's ``mnist_image_load``/``mnist_label_load`` store them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from importlib import resources
from pathlib import Path
from typing import TextIO

import numpy as np

from ... import F32
from ...errors import InvalidValueError, ShapeError
from ...io import idx
from ...opt import Dataset

__all__ = [
    "NINPUT",
    "NCLASSES",
    "HW",
    "FILES",
    "MnistData",
    "load_mnist",
    "load_split",
    "make_dataset",
    "image_ascii",
]

HW = 28
NINPUT = HW * HW
NCLASSES = 10

#: Role -> IDX file name; each may also be gzip-compressed with a ``.gz`` suffix.
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


@dataclasses.dataclass(frozen=True)
class MnistData:
    """Training and test images ``(n, 784)`` in ``[0, 1]`` and one-hot labels ``(n, 10)``."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str


def _find(data_dir: Path, name: str) -> Path:
    for candidate in (data_dir / name, data_dir / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"MNIST file missing: expected {data_dir / name} or {data_dir / name}.gz "
        "(ggml's mnist_image_load/mnist_label_load)"
    )


def _images(path: str | os.PathLike[str]) -> np.ndarray:
    raw = idx.read(path)
    if raw.dtype != np.uint8 or raw.ndim != 3 or raw.shape[1:] != (HW, HW):
        raise ShapeError(
            f"MNIST images {os.fspath(path)!r}: expected uint8 of shape (n, {HW}, {HW}), got "
            f"{raw.dtype} {raw.shape} (ggml's mnist_image_load)"
        )
    images: np.ndarray = raw.reshape(-1, NINPUT).astype(np.float32) / np.float32(255.0)
    return images


def _labels(path: str | os.PathLike[str]) -> np.ndarray:
    raw = idx.read(path)
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ShapeError(
            f"MNIST labels {os.fspath(path)!r}: expected uint8 of shape (n,), got "
            f"{raw.dtype} {raw.shape} (ggml's mnist_label_load)"
        )
    if raw.size and int(raw.max()) >= NCLASSES:
        raise InvalidValueError(
            f"MNIST labels {os.fspath(path)!r}: expected digits 0..{NCLASSES - 1}, got "
            f"{int(raw.max())} (ggml's mnist_label_load)"
        )
    one_hot: np.ndarray = np.eye(NCLASSES, dtype=np.float32)[raw]
    return one_hot


def _read_pair(images_path: str | os.PathLike[str], labels_path: str | os.PathLike[str],
               part: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = _images(images_path), _labels(labels_path)
    if len(images) != len(labels):
        raise ShapeError(
            f"MNIST {part} set: expected as many labels as images, got {len(images)} images "
            f"in {os.fspath(images_path)!r} and {len(labels)} labels in "
            f"{os.fspath(labels_path)!r}"
        )
    return images, labels


def load_split(
    data_dir: str | os.PathLike[str] | None, part: str
) -> tuple[np.ndarray, np.ndarray]:
    """Read one split, ``part`` ``"train"`` or ``"test"``: ``(images, one-hot labels)``.

    ``data_dir`` as for :func:`load_mnist`; only that split's two files are needed.
    """
    if part not in ("train", "test"):
        raise InvalidValueError(f"load_split: part: expected 'train' or 'test', got {part!r}")
    names = FILES[f"{part}_images"], FILES[f"{part}_labels"]
    if data_dir is None:
        root = resources.files(__package__) / "subset"
        with resources.as_file(root / f"{names[0]}.gz") as ip, \
                resources.as_file(root / f"{names[1]}.gz") as lp:
            return _read_pair(ip, lp, part)
    directory = Path(data_dir)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"MNIST data directory not found: {directory} (expected a directory with the "
            f"files {', '.join(FILES.values())}, raw or .gz)"
        )
    return _read_pair(_find(directory, names[0]), _find(directory, names[1]), part)


def load_mnist(data_dir: str | os.PathLike[str] | None = None) -> MnistData:
    """Read MNIST's four IDX files.

    Parameters
    ----------
    data_dir : path or None
        A directory with ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
        ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each raw or with ``.gz``.
        None reads the subset bundled with ggopt (the first 4000 training and 1000 test
        images of MNIST).

    Raises
    ------
    FileNotFoundError
        ``data_dir`` is not a directory or a file is missing (the message names it).
    ShapeError
        A file is not valid IDX, has the wrong shape, labels outside 0..9, or images and
        labels differ in number.
    """
    if data_dir is not None and Path(data_dir).is_dir():
        for name in FILES.values():  # fail on a missing file before reading anything
            _find(Path(data_dir), name)
    source = "the bundled subset" if data_dir is None else os.fspath(data_dir)
    return MnistData(*load_split(data_dir, "train"), *load_split(data_dir, "test"), source)


def make_dataset(
    images: np.ndarray, labels: np.ndarray, ndata_shard: int, multiple: int,
    *, stream: TextIO | None = None,
) -> Dataset:
    """A ``Dataset(F32, F32, 784, 10, ndata, ndata_shard)`` holding the first ``ndata`` images.

    ``ndata`` is ``len(images)`` rounded down to a multiple of ``multiple`` (and of
    ``ndata_shard``), so that :func:`ggopt.opt.fit` and :func:`ggopt.opt.epoch` can split it
    into whole batches; a note goes to ``stream`` (default stderr) when images are left out.
    ggml's datasets are ``ndata_shard=10`` for training and 500 for evaluation.

    Raises
    ------
    ShapeError
        Fewer than ``multiple`` images.
    """
    step = int(np.lcm(multiple, ndata_shard))
    ndata = len(images) // step * step
    if ndata == 0:
        raise ShapeError(
            f"MNIST dataset: expected at least {step} images (one batch of {multiple}, whole "
            f"shards of {ndata_shard}), got {len(images)} (ggml_opt_dataset_init)"
        )
    if ndata < len(images):
        out = sys.stderr if stream is None else stream
        out.write(f"note: using {ndata} of {len(images)} images (a multiple of {step})\n")
    ds = Dataset(F32, F32, NINPUT, NCLASSES, ndata, ndata_shard)
    assert ds.labels is not None  # made with labels above
    ds.data.numpy()[:] = images[:ndata]
    ds.labels.numpy()[:] = labels[:ndata]
    return ds


def image_ascii(image: np.ndarray) -> str:
    """A 28-line text picture of one image, as ggml's ``mnist_image_print`` draws it.

    Each pixel is ``round(255*x)`` (halves away from zero): ``█`` from 220, ``░`` from 10,
    a space below.
    """
    rgb = np.floor(np.asarray(image, dtype=np.float32).reshape(HW, HW) * np.float32(255.0) + 0.5)
    chars = np.where(rgb >= 220, "█", np.where(rgb >= 10, "░", " "))
    return "".join("".join(row) + "\n" for row in chars)
