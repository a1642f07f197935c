"""Crash-safe file writing: a temporary file in the target's directory, fsync, then rename.

Every ggopt file writer goes through :func:`atomic_path`, so a failure part-way (an exception,
a full disk, an interrupt) leaves an existing file untouched and no partial file behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator

from ..errors import FileWriteError
from .paths import check_output_path

__all__ = ["atomic_path"]


def _umask() -> int:
    """The process umask, read without changing it (Linux), else by a brief set-and-restore."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync(path: str, directory: bool = False) -> None:
    flags = os.O_RDONLY if directory else os.O_RDWR
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:  # some platforms cannot open directories; the rename stands anyway
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cause(exc: OSError, directory: str) -> str:
    """``exc`` in words, with the disk's free space where it is (nearly) full."""
    text = exc.strerror or str(exc)
    with contextlib.suppress(OSError):
        st = os.statvfs(directory)
        free = st.f_bavail * st.f_frsize
        if exc.errno == errno.ENOSPC or free < (1 << 20):
            text = f"no space left on the device ({free} bytes free; {text})"
    return text


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], what: str = "output file") -> Iterator[str]:
    """Yield a temporary path to write instead of ``path``; on success it replaces ``path``.

    ``path`` is first checked by :func:`~ggopt.io.paths.check_output_path` (an
    InvalidValueError starting with ``what`` for an empty path, a directory, a missing or
    read-only directory), so no writer fails with a raw OSError about a temporary file.

    On leaving the block without an exception the temporary file is flushed to disk (fsync),
    given the permissions a plain ``open(path, "w")`` would give (an existing file keeps its
    own), and renamed over ``path``. On an exception it is deleted and ``path`` is untouched;
    an OSError of the block (a full disk) becomes a FileWriteError naming ``path`` and the
    cause.
    A symbolic link at ``path`` is followed: its target is replaced.
    """
    final = check_output_path(path, what)
    directory = os.path.dirname(final)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(final)}.",
                               suffix=".tmp")
    os.close(fd)
    try:
        try:
            yield tmp
        except OSError as exc:
            if isinstance(exc, FileWriteError):
                raise
            raise FileWriteError(f"{what} {final!r}: writing failed: {_cause(exc, directory)}"
                                 f" (the file is unchanged)") from exc
        try:
            mode = os.stat(final).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        _fsync(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync(directory, directory=True)
