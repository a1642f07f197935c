"""Typed reads of a GGUF's ``tokenizer.*`` keys, each failure a GgoptError naming the key."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ggopt.errors import DTypeError, InvalidValueError
from ggopt.io.gguf_reader import GGUFFile
from ggopt.tokenizers.gguf_meta import Value, read_metadata, values

__all__ = ["Fields", "open_fields"]

_INTS = {0, 1, 2, 3, 4, 5, 10, 11}
_STRING, _ARRAY, _BOOL, _F32, _I32 = 8, 9, 7, 6, 5


def _type_name(types: tuple[int, ...]) -> str:
    return "/".join(GGUFValueType(t).name for t in types) or "nothing"


def _from_reader_field(field: Any) -> Value:
    types = tuple(int(t) for t in field.types)
    parts, data = field.parts, field.data
    if len(types) == 1:
        raw = parts[data[0]]
        return types, bytes(raw) if types[0] == _STRING else raw[0].item()
    if len(types) == 2 and types[0] == _ARRAY:
        if types[1] == _STRING:
            return types, [bytes(parts[i]) for i in data]
        if not len(data):
            return types, np.zeros(0)
        return types, np.concatenate([parts[i] for i in data])
    return types, None


class Fields:
    """GGUF metadata with typed, checked getters; values are converted on first use."""

    def __init__(self, values: Mapping[str, Any], *, reader_fields: bool) -> None:
        self._raw = values
        self._reader_fields = reader_fields
        self._done: dict[str, Value] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._raw

    def _get(self, key: str) -> Value:
        if key not in self._done:
            if key not in self._raw:
                raise InvalidValueError(f"{key}: missing from the GGUF metadata")
            raw = self._raw[key]
            self._done[key] = _from_reader_field(raw) if self._reader_fields else raw
        return self._done[key]

    def _scalar(self, key: str, allowed: set[int], what: str) -> Any:
        types, value = self._get(key)
        if len(types) != 1 or types[0] not in allowed:
            raise DTypeError(f"{key}: expected {what}, got {_type_name(types)}")
        return value

    def string(self, key: str, default: str | None = None) -> str | None:
        if key not in self._raw:
            return default
        raw = self._scalar(key, {_STRING}, "a string")
        try:
            return str(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidValueError(f"{key}: not valid UTF-8 ({exc})") from None

    def boolean(self, key: str, default: bool) -> bool:
        if key not in self._raw:
            return default
        return bool(self._scalar(key, {_BOOL}, "a bool"))

    def token_id(self, key: str) -> int | None:
        """A token id key (any integer type), or None when absent."""
        if key not in self._raw:
            return None
        value = int(self._scalar(key, _INTS, "an integer token id"))
        if value < 0:
            raise InvalidValueError(f"{key}: expected a token id >= 0, got {value}")
        return value

    def _array(self, key: str, allowed: set[int], what: str) -> Any:
        types, value = self._get(key)
        if len(types) != 2 or types[0] != _ARRAY or types[1] not in allowed:
            raise DTypeError(f"{key}: expected an array of {what}, got {_type_name(types)}")
        return value

    def strings(self, key: str) -> list[bytes]:
        """An array of strings as raw bytes (token texts are compared byte for byte)."""
        return list(self._array(key, {_STRING}, "strings"))

    def int_array(self, key: str) -> np.ndarray:
        return np.asarray(self._array(key, {_I32}, "INT32")).astype(np.int64)

    def float_array(self, key: str) -> np.ndarray:
        return np.asarray(self._array(key, {_F32, _I32}, "FLOAT32 (or INT32)")).astype(
            np.float32)


def open_fields(source: str | os.PathLike[str] | GGUFFile | GGUFReader | Mapping[str, Any]
                ) -> Fields:
    """Fields of a path (its metadata read directly), a file ggopt's reader read
    (:func:`ggopt.io.gguf_reader.open_gguf`), an open GGUFReader or its ``fields``."""
    if isinstance(source, GGUFFile):
        return Fields(values(source), reader_fields=False)
    if isinstance(source, GGUFReader):
        return Fields(source.fields, reader_fields=True)
    if isinstance(source, Mapping):
        return Fields(source, reader_fields=True)
    if not isinstance(source, (str, os.PathLike)):
        raise InvalidValueError(f"expected a path, a gguf.GGUFReader or its fields, got "
                                f"{type(source).__name__}")
    return Fields(read_metadata(source), reader_fields=False)
