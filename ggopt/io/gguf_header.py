"""A GGUF file's header for the checks before a load: the scalar keys, the lengths of the array
keys (their items are not made: a vocabulary of 49k strings is stepped over) and the tensor
list (ggml shape and type per name), no tensor data; read by :mod:`.gguf_reader`.
"""

from __future__ import annotations

import os
from typing import Any

from gguf.constants import GGUFValueType

from ..errors import GgoptError, ShapeError
from .gguf_reader import open_gguf

__all__ = ["read_header"]


def read_header(path: str | os.PathLike[str], where: str
                ) -> tuple[dict[str, Any], dict[str, int], dict[str, tuple[tuple[int, ...], int]]]:
    """``(scalars, array_lengths, tensors)`` of a GGUF file: key -> value for scalar and
    string keys, key -> item count for array keys, tensor name -> (ggml ne, type number).

    Raises ShapeError naming ``where`` when the file is missing, unreadable, not GGUF,
    truncated or damaged (a string key that is not UTF-8 included)."""
    if not os.path.isfile(os.fspath(path)):
        raise ShapeError(f"{where}: no such file")
    try:
        reader = open_gguf(path, f"{where}: not a readable GGUF file")
        scalars = {k: f.contents() for k, f in reader.fields.items()
                   if f.types[0] != GGUFValueType.ARRAY}
    except GgoptError as exc:
        raise ShapeError(str(exc)) from None
    lengths = {k: len(f.value) for k, f in reader.fields.items()
               if f.types[0] == GGUFValueType.ARRAY}
    tensors = {t.name: (t.shape, int(t.tensor_type)) for t in reader.tensors}
    return scalars, lengths, tensors
