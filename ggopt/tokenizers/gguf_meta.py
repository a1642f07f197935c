"""A GGUF file's key/value section for the tokenizer (the tensors are not touched), read by
:func:`ggopt.io.gguf_reader.open_gguf`: string arrays stay in the memory map until an item is
asked for, so a vocabulary of 150k tokens and 280k merges costs one offset per item."""

from __future__ import annotations

import os

from ggopt.errors import InvalidValueError
from ggopt.io.gguf_reader import GGUFFile, open_gguf

__all__ = ["read_metadata", "values", "Value"]

#: (type ids, value): ``(T,)`` with a Python scalar, str as bytes; ``(9, T)`` with a sequence
#: of bytes (strings) or a NumPy array (numbers).
Value = tuple[tuple[int, ...], object]


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Value]:
    """Every key/value pair of the GGUF file ``path``."""
    spath = os.fspath(path)
    if not os.path.isfile(spath):
        raise InvalidValueError(f"{spath!r}: no such file")
    return values(open_gguf(spath, repr(spath), tensors=False))


def values(reader: GGUFFile) -> dict[str, Value]:
    """Every key/value pair of a file already read."""
    return {k: (tuple(int(t) for t in f.types), f.value) for k, f in reader.fields.items()}
