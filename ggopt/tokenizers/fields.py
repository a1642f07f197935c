"""Typed reads of a GGUF's ``tokenizer.*`` keys, each failure a GgoptError naming the key."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ggopt.errors import DTypeError, InvalidValueError, ShapeError

__all__ = ["Fields", "open_fields"]

_INTS = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
         GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}


def _type_name(field: Any) -> str:
    return "/".join(GGUFValueType(t).name for t in field.types) or "nothing"


class Fields:
    """The metadata fields of an open ``gguf.GGUFReader`` with typed, checked getters."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = fields

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def _field(self, key: str) -> Any:
        try:
            return self._fields[key]
        except KeyError:
            raise InvalidValueError(f"{key}: missing from the GGUF metadata") from None

    def _scalar(self, key: str, allowed: set[GGUFValueType], what: str) -> Any:
        field = self._field(key)
        if len(field.types) != 1 or field.types[0] not in allowed:
            raise DTypeError(f"{key}: expected {what}, got {_type_name(field)}")
        return field.parts[field.data[0]]

    def string(self, key: str, default: str | None = None) -> str | None:
        if key not in self._fields:
            return default
        raw = bytes(self._scalar(key, {GGUFValueType.STRING}, "a string"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidValueError(f"{key}: not valid UTF-8 ({exc})") from None

    def boolean(self, key: str, default: bool) -> bool:
        if key not in self._fields:
            return default
        return bool(self._scalar(key, {GGUFValueType.BOOL}, "a bool")[0])

    def token_id(self, key: str) -> int | None:
        """A token id key (any integer type), or None when absent."""
        if key not in self._fields:
            return None
        value = int(self._scalar(key, _INTS, "an integer token id")[0])
        if value < 0:
            raise InvalidValueError(f"{key}: expected a token id >= 0, got {value}")
        return value

    def _array(self, key: str, allowed: set[GGUFValueType], what: str) -> Any:
        field = self._field(key)
        if (len(field.types) != 2 or field.types[0] != GGUFValueType.ARRAY
                or field.types[1] not in allowed):
            raise DTypeError(f"{key}: expected an array of {what}, got {_type_name(field)}")
        return field

    def strings(self, key: str) -> list[bytes]:
        """An array of strings as raw bytes (token texts are compared byte for byte)."""
        field = self._array(key, {GGUFValueType.STRING}, "strings")
        parts = field.parts
        return [bytes(parts[i]) for i in field.data]

    def numbers(self, key: str, allowed: set[GGUFValueType], what: str) -> np.ndarray:
        field = self._array(key, allowed, what)
        if not len(field.data):
            return np.zeros(0)
        parts = field.parts
        return np.concatenate([parts[i] for i in field.data])

    def int_array(self, key: str) -> np.ndarray:
        return self.numbers(key, {GGUFValueType.INT32}, "INT32").astype(np.int64)

    def float_array(self, key: str) -> np.ndarray:
        return self.numbers(key, {GGUFValueType.FLOAT32, GGUFValueType.INT32},
                            "FLOAT32 (or INT32)").astype(np.float32)


def open_fields(source: str | os.PathLike[str] | GGUFReader | Mapping[str, Any]) -> Fields:
    """Fields of a path (opened memory-mapped), an open GGUFReader or its ``fields`` mapping."""
    if isinstance(source, GGUFReader):
        return Fields(source.fields)
    if isinstance(source, Mapping):
        return Fields(source)
    if not isinstance(source, (str, os.PathLike)):
        raise InvalidValueError(f"expected a path, a gguf.GGUFReader or its fields, got "
                                f"{type(source).__name__}")
    path = os.fspath(source)
    try:
        reader = GGUFReader(path)
    except FileNotFoundError:
        raise InvalidValueError(f"{path!r}: no such file") from None
    except (OSError, ValueError, IndexError, KeyError) as exc:
        raise ShapeError(f"{path!r}: not a readable GGUF file ({exc})") from None
    return Fields(reader.fields)
