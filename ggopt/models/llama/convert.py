"""Rewriting a GGUF (any family) with every tensor in F32 (llama.cpp's ``--outtype f32``)."""

from __future__ import annotations

import os
from typing import Any

from gguf import GGUFValueType, GGUFWriter, LlamaFileType

from ...io.atomic import atomic_path
from .loader import read_weights

__all__ = ["write_f32"]

_SKIP = ("GGUF.", "general.architecture", "general.file_type")


def copy_keys(reader: Any, writer: GGUFWriter) -> None:
    """Every metadata key of ``reader`` (a ``GGUFReader``) into ``writer``, with its own type,
    except GGUF's own, ``general.architecture`` (the writer's) and ``general.file_type``
    (the caller's: it depends on the tensor types written)."""
    for key, field in reader.fields.items():
        if key.startswith(_SKIP):
            continue
        types = list(field.types)
        sub = types[-1] if types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), types[0], sub)


def write_f32(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Write ``src``'s keys and its tensors dequantized to F32 (same names and order) to
    ``dst``, with ``general.file_type`` = ALL_F32. ``src`` is checked completely (as
    :func:`ggopt.models.llama.load`) before ``dst`` is opened; ``dst`` is written atomically.
    """
    cfg, weights, reader = read_weights(src)
    order = [t.name for t in reader.tensors]
    with atomic_path(os.fspath(dst)) as tmp:
        writer = GGUFWriter(tmp, cfg.arch)
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
