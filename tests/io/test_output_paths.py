"""Output paths checked before any work: every writer refuses with a GgoptError
what it could not write, instead of a raw OSError about a temporary file."""

from __future__ import annotations

import os

import pytest

from ggopt.errors import DTypeError, InvalidValueError
from ggopt.io.atomic import atomic_path
from ggopt.io.paths import check_output_path


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
