"""Reading a llama GGUF's tensors: checked against the hyper-parameters, then dequantized to F32.

The file is memory-mapped (:func:`ggopt.io.gguf_reader.open_gguf`); every tensor's name, ggml
shape, type and byte size are checked before any memory is allocated, and each tensor is then
dequantized with ``gguf.quants.dequantize`` and copied into the model one at a time, with a
progress bar on stderr for large files.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ...errors import DTypeError, GgoptError, InvalidValueError, ShapeError
from ...io.gguf_reader import GGUFFile, open_gguf
from ...opt.progress import is_terminal, write_progress

__all__ = ["SUPPORTED_TYPES", "open_reader", "tensor_table", "check_tensors", "as_f32",
           "check_finite", "iter_f32", "file_weights", "ProgressBar"]

_Q = GGMLQuantizationType
#: The tensor types ggopt loads (dequantized to F32).
SUPPORTED_TYPES = frozenset({_Q.F32, _Q.F16, _Q.BF16, _Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1,
                             _Q.Q8_0, _Q.Q2_K, _Q.Q3_K, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K})
_NORM_TYPES = frozenset({_Q.F32})  # 1-D tensors: llama.cpp keeps norms in F32


def open_reader(path: str, where: str) -> GGUFFile:
    """:func:`ggopt.io.gguf_reader.open_gguf` with its failures (missing, not GGUF, truncated,
    damaged: any key or tensor that does not read) as ShapeError."""
    if not os.path.isfile(path):
        raise ShapeError(f"{where}: no such file")
    try:
        return open_gguf(path, f"{where}: not a readable GGUF file")
    except GgoptError as exc:
        raise ShapeError(str(exc)) from None


def tensor_table(reader: GGUFFile, where: str) -> dict[str, Any]:
    """The reader's tensors by name; a duplicate name is refused."""
    table: dict[str, Any] = {}
    for t in reader.tensors:
        if t.name in table:
            raise ShapeError(f"{where}: tensor {t.name!r} appears twice")
        table[t.name] = t
    return table


def check_tensors(table: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                  where: str) -> None:
    """Every expected tensor present with its ggml shape, a supported type and all its
    bytes in the file; no unexpected tensor (as llama.cpp, which counts them)."""
    missing = [n for n in shapes if n not in table]
    if missing:
        raise ShapeError(f"{where}: missing tensor(s) {', '.join(missing[:5])}")
    extra = [n for n in table if n not in shapes]
    if extra:
        raise ShapeError(f"{where}: unexpected tensor(s) {', '.join(extra[:5])} for a "
                         f"model of these hyper-parameters")
    for name, shape in shapes.items():
        t = table[name]
        ne = [int(d) for d in t.shape]
        if ne != list(shape[::-1]):
            raise ShapeError(f"{where}: tensor {name!r}: expected ggml shape "
                             f"{list(shape[::-1])}, got {ne}")
        qtype = _Q(int(t.tensor_type))
        allowed = _NORM_TYPES | {_Q.F16, _Q.BF16} if len(shape) == 1 else SUPPORTED_TYPES
        if qtype not in allowed:
            raise DTypeError(f"{where}: tensor {name!r} has type {qtype.name}; ggopt loads "
                             f"{', '.join(sorted(q.name for q in allowed))}")


def as_f32(t: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A file tensor's values as native float32 (a big-endian file's too), NumPy order
    (dequantized with ``gguf.quants``)."""
    qtype = _Q(int(t.tensor_type))
    raw = np.asarray(t.data)
    if qtype == _Q.F32:
        out = raw.reshape(shape).astype(np.float32, copy=False)  # native order (no copy)
    elif qtype == _Q.F16:
        out = raw.reshape(shape).astype(np.float32)
    else:  # a non-finite scale gives NaN, refused by the caller (no NumPy warning on the way)
        with np.errstate(invalid="ignore", over="ignore"):
            out = np.asarray(dequantize(raw, qtype), np.float32).reshape(shape)
    return out


def check_finite(arr: np.ndarray, name: str, where: str) -> None:
    """InvalidValueError when ``arr`` holds a NaN or an infinity."""
    if not np.isfinite(arr).all():
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise InvalidValueError(f"{where}: tensor {name!r} holds {bad} NaN or infinite "
                                f"value(s)")


def iter_f32(table: dict[str, Any], shapes: dict[str, tuple[int, ...]], where: str,
             bar: ProgressBar | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, float32 array in NumPy order)`` per tensor; a non-finite value is refused."""
    for i, (name, shape) in enumerate(shapes.items()):
        arr = as_f32(table[name], shape)
        check_finite(arr, name, where)
        if bar is not None:
            bar.update(i + 1, int(table[name].n_bytes))
        yield name, arr


class _FileWeights(Mapping[str, np.ndarray]):
    def __init__(self, path: str) -> None:
        where = f"llm weights {path!r}"
        self.table = tensor_table(open_reader(path, where), where)

    def __getitem__(self, name: str) -> np.ndarray:
        t = self.table[name]
        return as_f32(t, tuple(int(d) for d in t.shape)[::-1])

    def __contains__(self, name: object) -> bool:  # without reading the tensor
        return name in self.table

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


def file_weights(path: str | os.PathLike[str]) -> Mapping[str, np.ndarray]:
    """A GGUF's tensors as float32 NumPy-order arrays by name, each read (dequantized) from the
    file when it is looked up and not kept (a base stored in BF16 merged with an adapter from
    the file's own values)."""
    return _FileWeights(os.fspath(path))


class ProgressBar:
    """``load: [#####.....] 136/272 tensors, 46 MB`` on ``stream``: redrawn in place on a
    terminal; elsewhere a line at the start, every ~10 % and at the end
    (:func:`ggopt.opt.progress.write_progress`)."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.stream, self.nbytes = total, stream or sys.stderr, 0
        self._shown = -1
        self._terminal = is_terminal(self.stream)

    def update(self, done: int, nbytes: int) -> None:
        self.nbytes += nbytes
        filled = math.floor(self.WIDTH * done / max(self.total, 1))
        if self._terminal:
            if filled == self._shown and done != self.total:
                return
            self._shown = filled
        bar = "#" * filled + "." * (self.WIDTH - filled)
        end = "\n" if done == self.total else ""
        write_progress(self.stream, f"\rload: [{bar}] {done}/{self.total} tensors, "
                                    f"{self.nbytes / 1e6:.0f} MB{end}", done, self.total,
                       self._terminal)
