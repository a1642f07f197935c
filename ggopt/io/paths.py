"""The check every file writer's entry point makes on an output path before any work starts.

:func:`check_output_path` refuses, with an :class:`~ggopt.errors.InvalidValueError` naming the
option, what :func:`~ggopt.io.atomic.atomic_path` could not write or should not replace: an
empty path, a directory, something that is not a regular file, a missing or read-only
directory, and a path that names the same file as one of the run's other files (its input
text, its checkpoint), compared after resolving links and by inode (hard links).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from ..errors import DTypeError, InvalidValueError

__all__ = ["PathLike", "check_output_path", "same_file", "text_path"]

PathLike = str | os.PathLike[str]


def text_path(path: object, option: str) -> str:
    """``path`` as a non-empty str; DTypeError unless it is a str or a text os.PathLike,
    InvalidValueError when empty (``option`` names the argument in the message)."""
    if not isinstance(path, (str, os.PathLike)):
        raise DTypeError(f"{option}: expected a path (str or os.PathLike), got "
                         f"{type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise DTypeError(f"{option}: expected a text path, got {type(text).__name__}")
    if not text:
        raise InvalidValueError(f"{option}: the path is empty")
    return text


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: the same resolved path, or (both existing) the
    same device and inode, as hard links do."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def check_output_path(path: object, option: str,
                      others: Iterable[tuple[str, PathLike]] = ()) -> str:
    """Raise unless ``path`` can be written atomically as a new or replaced regular file;
    return it resolved (links followed). Changes nothing.

    ``others``: ``(option, path)`` pairs of the run's other files; ``path`` naming the same
    file as any of them is refused.

    Raises
    ------
    DTypeError
        ``path`` is not a str or os.PathLike.
    InvalidValueError
        Empty; a directory or another non-regular file; its directory is missing, not a
        directory or not writable; the same file as one of ``others``. The message starts
        with ``option``.
    """
    text = text_path(path, option)
    final = os.path.realpath(text)
    try:
        st = os.stat(final)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InvalidValueError(f"{option} {text!r}: cannot be examined ({exc.strerror})") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InvalidValueError(f"{option} {text!r}: is a directory; expected a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InvalidValueError(f"{option} {text!r}: exists and is not a regular file; "
                                "expected a new file or one to replace")
    directory = os.path.dirname(final)
    if not os.path.isdir(directory):
        raise InvalidValueError(f"{option} {text!r}: directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidValueError(f"{option} {text!r}: directory {directory!r} is not writable")
    for other_option, other in others:
        if same_file(final, text_path(other, other_option)):
            raise InvalidValueError(f"{option} {text!r} is the same file as {other_option} "
                                    f"{os.fspath(other)!r}; writing it would destroy that file")
    return final
