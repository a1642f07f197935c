"""Writing a fine-tuned llama back as GGUF: every key of the input kept (tokenizer, chat template,
``context_length``), the tensors in the input's order, ``general.file_type`` set to what was
written.

Output types: ``f32``; ``f16`` / ``bf16`` / ``q8_0`` for the matrices (norms stay F32 as
llama.cpp keeps them; a matrix whose rows are not whole Q8_0 blocks is written F16); ``keep``:
a tensor that did not change keeps its original bytes, a changed one is re-quantized to its own
type where ``gguf.quants`` can (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), else written F16
(K-quants and IQ types: ``gguf`` has no quantizer for them); :func:`export` says which.

Every changed tensor written in a lossy type (F16, BF16, a quantization) is measured: the share
of the fine-tune's change ``new - old`` that the written weights keep, ``<written - old, new -
old> / |new - old|^2`` summed over those tensors (:attr:`ExportReport.change_kept`). A LoRA
delta below the step of the base's quantization (Q4_1 on SmolLM2) keeps little of it;
:meth:`ExportReport.loss_warning` says so with the number. The lossless small form of a LoRA on
a quantized base is the adapter beside the unchanged base (llama.cpp's ``--lora``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType
from gguf.quants import dequantize, quantize

from ..errors import DTypeError, InvalidValueError
from ..io.atomic import atomic_path
from ..io.paths import text_path
from ..models.llama.convert import ModelWriter, check_keys, check_written, copy_keys
from ..models.llama.mapped import check_blocks_finite
from ..models.llama.weights import as_f32, check_finite, open_reader, tensor_table
from ..types import GGType

__all__ = ["OUT_TYPES", "ExportReport", "export"]

_Q = GGMLQuantizationType
_FT = LlamaFileType
OUT_TYPES = ("f32", "f16", "bf16", "q8_0", "keep")
_TARGET = {"f32": (_Q.F32, _FT.ALL_F32), "f16": (_Q.F16, _FT.MOSTLY_F16),
           "bf16": (_Q.BF16, _FT.MOSTLY_BF16), "q8_0": (_Q.Q8_0, _FT.MOSTLY_Q8_0)}
_CHAT_TEMPLATE = "tokenizer.chat_template"
_REQUANTIZABLE = frozenset({_Q.F32, _Q.F16, _Q.BF16, _Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1,
                            _Q.Q8_0})


@dataclasses.dataclass
class ExportReport:
    """What :func:`export` wrote: tensor names kept byte for byte, re-quantized to their own
    type, and written as F16 for want of a quantizer; the file type stored."""

    kept: list[str] = dataclasses.field(default_factory=list)
    requantized: list[str] = dataclasses.field(default_factory=list)
    as_f16: list[str] = dataclasses.field(default_factory=list)
    file_type: int = 0
    change_sq: float = 0.0  # |new - old|^2 over the changed tensors written in a lossy type
    kept_dot: float = 0.0  # <written - old, new - old> over the same tensors
    lossy: set[str] = dataclasses.field(default_factory=set)  # their types' names

    @property
    def file_type_name(self) -> str:
        """``general.file_type`` by llama.cpp's name (``ALL_F32``, ``MOSTLY_Q4_1``, ...)."""
        try:
            return _FT(self.file_type).name
        except ValueError:
            return f"file type {self.file_type}"

    @property
    def change_kept(self) -> float | None:
        """The share of the fine-tune's change to the weights written in a lossy type that
        the written weights keep (1: all of it); None when no such weight changed."""
        return self.kept_dot / self.change_sq if self.change_sq > 0 else None

    def loss_warning(self, threshold: float = 0.5) -> str | None:
        """A warning with the number when the written weights keep less than ``threshold``
        of the change (most of the fine-tune lost), else None."""
        kept = self.change_kept
        if kept is None or kept >= threshold:
            return None
        return (f"the written {'/'.join(sorted(self.lossy))} weights keep {100 * kept:.0f}% "
                f"of the fine-tune's change to them (the rest is below the type's step): most "
                f"of what was trained is lost; --out-type f32 keeps all of it, and for a LoRA "
                f"on a quantized base the adapter (--adapter-out) beside the unchanged base is "
                f"the lossless small form")

    def summary(self) -> str:
        kept = self.change_kept
        note = "" if kept is None else f"; {100 * kept:.0f}% of the change kept"
        return self._summary() + note

    def _summary(self) -> str:
        if not (self.kept or self.requantized):
            return self.file_type_name + (
                f", {len(self.as_f16)} tensors F16 (rows not whole blocks)" if self.as_f16 else "")
        return (f"{len(self.kept)} tensors unchanged (original bytes), {len(self.requantized)} "
                f"re-quantized to their own type, {len(self.as_f16)} written F16"
                + (f" ({', '.join(self.as_f16[:3])}...)" if self.as_f16 else ""))


def _encode(arr: np.ndarray, qtype: _Q) -> np.ndarray:
    """``arr`` (float32) as the bytes of ``qtype`` (one :func:`_out_qtype` chose for it)."""
    if qtype == _Q.F32:
        return np.ascontiguousarray(arr, np.float32)
    if qtype == _Q.F16:
        return arr.astype(np.float16)
    return quantize(np.ascontiguousarray(arr, np.float32), qtype)


def _out_qtype(qtype: _Q, shape: tuple[int, ...]) -> _Q:
    """``qtype`` where the rows are whole blocks of it, else F16."""
    return qtype if shape[-1] % GGML_QUANT_SIZES[qtype][0] == 0 else _Q.F16


def _checked(weights: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...],
             where: str) -> np.ndarray:
    """``weights[name]``: a finite float32 array of ``shape``, else an error."""
    arr = weights[name]
    if not isinstance(arr, np.ndarray) or arr.shape != shape:
        got = arr.shape if isinstance(arr, np.ndarray) else type(arr).__name__
        raise InvalidValueError(f"{where}: weight {name!r} expected a float32 array of "
                                f"shape {shape}, got {got}")
    if arr.dtype != np.float32:
        raise DTypeError(f"{where}: weight {name!r} must be float32, got {arr.dtype}")
    check_finite(arr, name, f"{where}: the weights (training diverged?)")
    return arr


def _check_encoded(data: np.ndarray, qtype: _Q, name: str, where: str) -> None:
    """InvalidValueError when a finite weight became non-finite in its output type (F16 holds
    at most 65504, a block's F16 scale max/127 or so): the file would not load."""
    fix = "write it with --out-type f32 (or a type of wider range)"
    if qtype == _Q.F16 or qtype == _Q.BF16:
        values = np.asarray(data) if qtype == _Q.F16 else dequantize(data, qtype)
        if not np.isfinite(values).all():
            raise InvalidValueError(f"{where}: weight {name!r} exceeds {qtype.name}'s range "
                                    f"(it would be stored as infinities); {fix}")
    elif qtype != _Q.F32:
        try:
            check_blocks_finite(np.asarray(data), GGType(int(qtype)), name, where)
        except InvalidValueError as exc:
            raise InvalidValueError(f"{exc} (the values exceed {qtype.name}'s range); "
                                    f"{fix}") from None


def _decoded(data: np.ndarray, qtype: _Q, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values ``data`` (``qtype``'s bytes) stands for."""
    if qtype in (_Q.F32, _Q.F16):
        return np.asarray(data, np.float32).reshape(shape)
    return np.asarray(dequantize(np.asarray(data), qtype), np.float32).reshape(shape)


def _measure(report: ExportReport, t: Any, shape: tuple[int, ...], new: np.ndarray,
             data: np.ndarray, qtype: _Q) -> None:
    """Add one tensor written in a lossy ``qtype`` to the report's share of the change kept."""
    delta = new.astype(np.float64) - as_f32(t, shape)
    change = float(np.vdot(delta, delta))
    if change == 0.0:
        return
    written = _decoded(data, qtype, shape) - (new.astype(np.float64) - delta)
    report.change_sq += change
    report.kept_dot += float(np.vdot(written, delta))
    report.lossy.add(qtype.name)


def _original(t: Any) -> np.ndarray:
    """A source tensor's bytes as stored (F32/F16 of a big-endian file: in this file's order)."""
    data = np.asarray(t.data)
    return data.astype(data.dtype.newbyteorder("="), copy=False)


def _choose(out_type: str, t: Any, shape: tuple[int, ...], new: np.ndarray,
            report: ExportReport, where: str) -> _Q | None:
    """The type one tensor is written as; None: its original bytes (``keep``, unchanged)."""
    own = _Q(int(t.tensor_type))
    if out_type == "keep":
        old = as_f32(t, shape)
        check_finite(old, t.name, where)
        if np.array_equal(old, new):
            report.kept.append(t.name)
            return None
        if own in _REQUANTIZABLE:
            report.requantized.append(t.name)
            return own
        report.as_f16.append(t.name)
        return _Q.F16
    if new.ndim == 1:
        return _Q.F32
    qtype = _out_qtype(_TARGET[out_type][0], shape)
    if qtype != _TARGET[out_type][0]:
        report.as_f16.append(t.name)
    return qtype


def check_exportable(src: str | os.PathLike[str]) -> None:
    """That :func:`export` can write ``src``'s metadata back (call it before training, so that
    a run is not lost at its end).

    Raises
    ------
    ShapeError
        A key the writer cannot write, or ``src`` unreadable.
    """
    where = f"export {text_path(src, 'export: src')!r}"
    check_keys(open_reader(os.fspath(src), where), where)


def export(src: str | os.PathLike[str], dst: str | os.PathLike[str],
           weights: Mapping[str, np.ndarray], out_type: str = "f32",
           unchanged: Collection[str] = (), *,
           chat_template: str | None = None) -> ExportReport:
    """Write ``src``'s keys with ``weights`` (float32, NumPy order, llama.cpp names) to ``dst``
    as ``out_type`` (atomically; ``src`` is read again to compare and copy).

    ``unchanged``: names the caller knows still hold ``src``'s values (a LoRA's frozen base
    outside the adapted weights); with ``keep`` their bytes are copied without computing or
    comparing them.

    ``chat_template``: written as ``tokenizer.chat_template`` in place of ``src``'s (the
    template a chat fine-tune was trained with, so that the result is self-contained).

    ``weights`` may compute its arrays on access (:func:`ggopt.models.llama.weight_map`,
    :func:`ggopt.lm.lora.merged`): they are taken one at a time, twice (once to check and
    choose each tensor's type, once to write it), so the export holds one tensor as float32 at
    a time, not the model.

    Raises
    ------
    InvalidValueError
        An unknown ``out_type``, a weight missing or misshaped for ``src``'s tensors, a
        non-finite weight, a weight beyond the range of the type it would be written as
        (the loader would refuse the file); the output is then not replaced.
    DTypeError
        ``weights`` not a mapping of float32 arrays.
    """
    if chat_template is not None and (not isinstance(chat_template, str) or
                                      not chat_template):
        raise InvalidValueError(f"export: chat_template must be a non-empty str, got "
                                f"{chat_template!r:.80}")
    if out_type not in OUT_TYPES:
        raise InvalidValueError(f"export: --out-type must be one of {', '.join(OUT_TYPES)}, "
                                f"got {out_type!r}")
    where = f"export {text_path(src, 'export: src')!r}"
    reader = open_reader(os.fspath(src), where)
    table = tensor_table(reader, where)
    shapes = {name: tuple(int(d) for d in t.shape)[::-1] for name, t in table.items()}
    if not isinstance(weights, Mapping):
        raise DTypeError(f"{where}: weights must be a mapping name -> float32 array, got "
                         f"{type(weights).__name__}")
    missing = [name for name in shapes if name not in weights]
    if missing:
        raise InvalidValueError(f"{where}: weight {missing[0]!r} expected a float32 array of "
                                f"shape {shapes[missing[0]]}, got None")
    report = ExportReport()
    keep = frozenset(unchanged) if out_type == "keep" else frozenset()
    types: dict[str, _Q | None] = {}
    for name, t in table.items():
        if name in keep:
            report.kept.append(name)
            types[name] = None
        else:
            types[name] = _choose(out_type, t, shapes[name],
                                  _checked(weights, name, shapes[name], where), report, where)
    ft_field = reader.fields.get("general.file_type")
    if out_type == "keep":
        report.file_type = int(ft_field.contents()) if ft_field is not None else -1
    else:
        report.file_type = int(_TARGET[out_type][1])
    with atomic_path(text_path(dst, "export: dst")) as tmp:
        writer = ModelWriter(tmp, _architecture(reader))
        try:
            if chat_template is None:
                copy_keys(reader, writer)
            else:
                copy_keys(reader, writer, skip={_CHAT_TEMPLATE})
                writer.add_key_value(_CHAT_TEMPLATE, chat_template, GGUFValueType.STRING)
            if report.file_type >= 0:
                writer.add_key_value("general.file_type", report.file_type,
                                     GGUFValueType.UINT32)
            for name, t in table.items():
                qtype = types[name]
                writer.add_tensor_info(
                    name, shapes[name], np.dtype(np.float32),
                    int(t.n_bytes) if qtype is None else _nbytes(shapes[name], qtype),
                    raw_dtype=_Q(int(t.tensor_type)) if qtype is None else qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for name, t in table.items():
                qtype = types[name]
                if qtype is None:
                    writer.write_tensor_data(_original(t))
                    continue
                new = _checked(weights, name, shapes[name], where)
                with np.errstate(over="ignore"):  # an overflow is refused just below
                    data = _encode(new, qtype)
                _check_encoded(data, qtype, name, where)
                if qtype != _Q.F32:
                    _measure(report, t, shapes[name], new, data, qtype)
                writer.write_tensor_data(data)
        finally:
            writer.close()
        check_written(tmp, {name: (tuple(int(d) for d in t.shape),
                                   int(t.tensor_type) if types[name] is None else
                                   int(types[name]))  # type: ignore[arg-type]
                            for name, t in table.items()}, where)
    return report


def _architecture(reader: Any) -> str:
    """``src``'s ``general.architecture`` (kept as it is)."""
    field = reader.fields.get("general.architecture")
    return str(field.contents()) if field is not None else "llama"


def _nbytes(shape: tuple[int, ...], qtype: _Q) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size
