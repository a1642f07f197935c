"""Exceptions raised by ggopt.

ggml aborts the process on a failed ``GGML_ASSERT``; ggopt raises one of these instead,
always *before* any state has changed.
"""

from __future__ import annotations

__all__ = [
    "GgoptError",
    "ShapeError",
    "InvalidValueError",
    "DTypeError",
    "StateError",
    "BackendUnavailableError",
    "OutOfMemoryError",
    "FileWriteError",
]


class GgoptError(Exception):
    """Base class of every error ggopt raises on bad input or misuse."""


class ShapeError(GgoptError, ValueError):
    """A shape, size, stride, offset or index is not what the operation expects."""


class InvalidValueError(GgoptError, ValueError):
    """An argument value that is not a shape is out of range or not one of the allowed choices
    (a thread count, an enum name, an optimizer hyper-parameter, ...)."""


class DTypeError(GgoptError, TypeError):
    """A tensor or array has the wrong element type."""


class StateError(GgoptError, RuntimeError):
    """A call came in the wrong order, or an object is not in the state it needs."""


class BackendUnavailableError(GgoptError, RuntimeError):
    """A backend was asked for that this machine cannot provide (for example no CuPy/GPU)."""


class OutOfMemoryError(GgoptError, MemoryError):
    """A context or buffer has no room left for the requested tensor."""


class FileWriteError(GgoptError, OSError):
    """Writing an output file failed (a full disk, an I/O error); the message names the file
    and the cause, and an existing file at that path is untouched."""
