"""Every file writer (GGUF, IDX, the loss plot) keeps the old file when writing fails midway, and
creates files with the permissions of a plain open().
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ggopt import (
    opt,
)
from ggopt.io import gguf as ggio


def _leftovers(d: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name not in keep)


def test_plot_failing_mid_write_keeps_the_file(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from ggopt.cli.plot import plot_history

    history = opt.FitHistory()
    for name in ("train", "val"):
        for field in ("loss", "loss_unc", "acc", "acc_unc"):
            getattr(history, f"{name}_{field}").append(0.5)
    history.seconds.append(1.0)
    path = tmp_path / "curves.png"
    plot_history(history, path)
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG")
    real_savefig = Figure.savefig

    def failing(self, fname, **kwargs):
        real_savefig(self, fname, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", failing)
    with pytest.raises(OSError, match="disk full"):
        plot_history(history, path, title="second")
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {"curves.png"}) == []


def test_writers_keep_permissions_like_a_plain_open(tmp_path):
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    os.chmod(path, 0o640)
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_full_disk_names_the_file_and_the_cause(tmp_path, monkeypatch):
    """Issue 32 row 17: a full disk at save printed ``4096 requested and 3872 written``
    (NumPy's tofile), naming neither the file nor the cause."""
    import errno
    from types import SimpleNamespace

    import gguf

    from ggopt.errors import FileWriteError, GgoptError

    path = tmp_path / "m.gguf"
    META = {"general.architecture": "test"}  # noqa: N806
    ggio.save(path, {"w": np.ones((2, 3), np.float32)}, META)
    before = path.read_bytes()

    def full(self, *args, **kwargs):
        raise OSError("4096 requested and 3872 written")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)
    monkeypatch.setattr(os, "statvfs", lambda d: SimpleNamespace(f_bavail=3, f_frsize=4096))
    with pytest.raises(FileWriteError, match="no space left on the device") as info:
        ggio.save(path, {"w": np.zeros((2, 3), np.float32)}, META)
    assert str(path) in str(info.value) and "unchanged" in str(info.value)
    assert isinstance(info.value, GgoptError) and isinstance(info.value, OSError)
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {"m.gguf"}) == []
    monkeypatch.undo()

    def eio(self, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", eio)
    with pytest.raises(FileWriteError, match="writing failed: Input/output error"):
        ggio.save(path, {"w": np.zeros((2, 3), np.float32)}, META)
