"""Rewriting a GGUF (any family) with every tensor in F32 (llama.cpp's ``--outtype f32``)."""

from __future__ import annotations

import os
import struct
from collections.abc import Collection, Mapping
from typing import Any

from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType

from ...errors import ShapeError
from ...io.atomic import atomic_path
from .loader import read_weights
from .weights import open_reader, tensor_table

__all__ = ["write_f32", "copy_keys", "check_keys", "check_written", "ModelWriter"]

_ALIGNMENT = "general.alignment"

_SKIP = ("GGUF.", "general.architecture", "general.file_type")


class ModelWriter(GGUFWriter):
    """GGUFWriter that also writes an empty array (legal GGUF, which llama.cpp reads; the
    gguf package refuses to write one)."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool,
                  sub_type: GGUFValueType | None = None) -> bytes:
        if vtype == GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def copy_keys(reader: Any, writer: GGUFWriter, skip: Collection[str] = ()) -> None:
    """Every metadata key of ``reader`` (a :class:`ggopt.io.gguf_reader.GGUFFile`) into
    ``writer``, with its own type (strings as the file's bytes: a token need not be UTF-8),
    except GGUF's own, ``general.architecture`` (the writer's), ``general.file_type``
    (the caller's: it depends on the tensor types written) and the keys in ``skip`` (the
    caller writes them); ``general.alignment`` becomes the writer's alignment (the data padded
    to it, as the key tells readers)."""
    for key, field in reader.fields.items():
        if key.startswith(_SKIP) or key in skip:
            continue
        types = list(field.types)
        if key == _ALIGNMENT:  # the data is padded to it (llama.cpp honours the key)
            value = field.contents()
            if types != [GGUFValueType.UINT32] or not 0 < value < 1 << 16 or value & (value - 1):
                raise ShapeError(f"{_ALIGNMENT}: expected a power of two of type UINT32, got "
                                 f"{value!r}")
            writer.add_custom_alignment(int(value))
            continue
        sub = types[1] if types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.raw(), types[0], sub)


def check_keys(reader: Any, where: str) -> None:
    """That :func:`copy_keys` can write every key of ``reader``: run before training, so that
    an export at the end cannot fail on the input's metadata.

    Raises
    ------
    ShapeError
        A key the writer cannot write (a bad ``general.alignment``, a value out of its type's
        range, ...).
    """
    writer = ModelWriter(None, "llama")
    key = "?"
    try:
        copy_keys(reader, writer)
        for key, value in writer.kv_data[0].items():  # noqa: B007 (named below)
            writer._pack_val(value.value, value.type, True, value.sub_type)
    except ShapeError as exc:
        raise ShapeError(f"{where}: the model's metadata cannot be written back: {exc}") \
            from None
    except (ValueError, TypeError, OverflowError, struct.error) as exc:
        raise ShapeError(f"{where}: the model's metadata cannot be written back: key "
                         f"{key!r}: {exc}") from None


def check_written(path: str, expected: Mapping[str, tuple[tuple[int, ...], int]],
                  where: str) -> None:
    """Read the GGUF just written at ``path`` back and check it before it replaces the target:
    every tensor of ``expected`` (name -> ggml shape, type) present as expected, its data at a
    multiple of the file's alignment and within the file, nothing else.

    Raises
    ------
    ShapeError
        The file does not read back as written (the writer's bug, never the user's file).
    """
    reader = open_reader(path, f"{where}: the file written")
    table = tensor_table(reader, where)
    size = len(reader.data)
    align = int(reader.alignment)
    if set(table) != set(expected):
        raise ShapeError(f"{where}: the file written holds tensors {sorted(table)[:5]}, "
                         f"expected {sorted(expected)[:5]}")
    for name, t in table.items():
        shape, qtype = expected[name]
        got = tuple(int(d) for d in t.shape)
        start = int(t.data_offset)
        if got != shape or int(t.tensor_type) != qtype or (start - reader.data_offset) % align \
                or start + int(t.n_bytes) > size:
            raise ShapeError(f"{where}: the file written does not read back: tensor {name!r} "
                             f"(shape {got}, type {int(t.tensor_type)}, data at {start} of "
                             f"{size} bytes, alignment {align})")


def write_f32(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Write ``src``'s keys and its tensors dequantized to F32 (same names and order) to
    ``dst``, with ``general.file_type`` = ALL_F32. ``src`` is checked completely (as
    :func:`ggopt.models.llama.load`) before ``dst`` is opened; ``dst`` is written atomically.
    """
    cfg, weights, reader = read_weights(src)
    order = [t.name for t in reader.tensors]
    expected = {t.name: (tuple(int(d) for d in t.shape), int(GGMLQuantizationType.F32))
                for t in reader.tensors}
    with atomic_path(os.fspath(dst)) as tmp:
        writer = ModelWriter(tmp, cfg.arch)
        try:
            copy_keys(reader, writer)
            writer.add_key_value("general.file_type", int(LlamaFileType.ALL_F32),
                                 GGUFValueType.UINT32)
            for name in order:
                writer.add_tensor(name, weights[name])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        check_written(tmp, expected, f"write_f32 {os.fspath(dst)!r}")
