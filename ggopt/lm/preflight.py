"""Checks of a run's inputs before any model loads (a large model takes minutes to load): the
model file's keys and tensor list read without its tensor data, the text files read and
decoded, LoRA ranks and targets against the model's shapes, ``--ctx`` against the model's
context and the memory, a checkpoint to resume read without its tensors."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType

from ..errors import InvalidValueError, OutOfMemoryError, ShapeError, StateError
from ..io.gguf_header import read_header
from ..io.paths import text_path
from ..models.llama import Config, param_shapes
from ..models.llama.weights import open_reader
from ..opt.checkpoint_file import RUN, STATE
from . import lora

__all__ = ["Dims", "ModelInfo", "model_info", "read_texts", "check_lora", "check_ctx",
           "activation_bytes", "available_bytes", "checkpoint_run"]


class Dims(Protocol):
    """The sizes the checks need (a :class:`ModelInfo` or a loaded model's ``Config``)."""

    @property
    def n_ctx(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def n_head(self) -> int: ...
    @property
    def n_ff(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a model file's header says: its sizes (``{arch}.*`` keys; 0 where absent, the
    loader then names the key), its file type's name, its tensors' types and shapes."""

    path: str
    arch: str
    n_ctx: int
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    n_vocab: int
    file_type: str  # llama.cpp's name, e.g. MOSTLY_Q4_1; "unknown" when the key is absent
    tensor_types: dict[str, int]  # type name -> tensor count
    shapes: dict[str, tuple[int, ...]]  # ggml ne per tensor name

    @property
    def quantized(self) -> bool:
        """True when a tensor is stored in a quantized type (not F32/F16/BF16)."""
        return any(t not in ("F32", "F16", "BF16") for t in self.tensor_types)

    def types_text(self) -> str:
        """``"14 Q4_1, 5 F32"``."""
        return ", ".join(f"{n} {t}" for t, n in sorted(self.tensor_types.items(),
                                                       key=lambda kv: -kv[1]))


def _int(kv: dict[str, Any], key: str) -> int:
    v = kv.get(key)
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else 0


def model_info(path: object, option: str = "--model") -> ModelInfo:
    """A model file's header (:func:`ggopt.io.gguf_header.read_header`: keys and tensor
    list, the big arrays skipped, no tensor data): well under a second for any model.

    Raises
    ------
    ShapeError
        Not a readable GGUF file (missing, truncated, damaged).
    InvalidValueError
        ``path`` is a LoRA adapter (``general.type = adapter``), not a model: the message
        says so and how to pass it (``--lora``).
    """
    spath = text_path(path, option)
    where = f"{option} {spath!r}"
    kv, lengths, tensors = read_header(spath, where)
    if kv.get("general.type") == "adapter":
        raise InvalidValueError(f"{where} is a LoRA adapter (general.type=adapter), not a "
                                f"model: give the base model as --model and the adapter with "
                                f"--lora {spath}")
    arch = kv.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    types: dict[str, int] = {}
    for _, qtype in tensors.values():
        name = _qtype_name(qtype)
        types[name] = types.get(name, 0) + 1
    name = "unknown"
    if "general.file_type" in kv:
        try:
            name = LlamaFileType(_int(kv, "general.file_type")).name
        except ValueError:
            name = f"file type {kv['general.file_type']}"
    return ModelInfo(spath, arch, _int(kv, f"{arch}.context_length"),
                     _int(kv, f"{arch}.embedding_length"), _int(kv, f"{arch}.block_count"),
                     _int(kv, f"{arch}.attention.head_count"),
                     _int(kv, f"{arch}.feed_forward_length"),
                     lengths.get("tokenizer.ggml.tokens", 0), name, types,
                     {n: shape for n, (shape, _) in tensors.items()})


def _qtype_name(qtype: int) -> str:
    try:
        return GGMLQuantizationType(qtype).name
    except ValueError:
        return f"type {qtype}"


def read_texts(paths: Sequence[object], option: str = "--text") -> list[str]:
    """The files' text, each decoded as UTF-8; InvalidValueError naming the file (and the
    byte offset of a bad sequence) when one cannot be read or decoded."""
    texts = []
    for path in paths:
        spath = text_path(path, option)
        try:
            with open(spath, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise InvalidValueError(f"{option} {spath!r}: cannot read: "
                                    f"{exc.strerror or exc}") from None
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidValueError(f"{option} {spath!r}: not UTF-8 text (byte {exc.start}: "
                                    f"{exc.reason}); convert it, e.g. iconv -t UTF-8") from None
    return texts


def check_lora(info: ModelInfo | Config, rank: int,
               targets: str | Sequence[str]) -> tuple[str, ...]:
    """The parsed targets; InvalidValueError for an unknown target, or a rank below 1 or
    above a target matrix's smaller side (as :func:`ggopt.lm.lora.create` would refuse)."""
    names = lora.parse_targets(targets)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidValueError(f"--lora: the rank must be an int >= 1, got {rank!r}")
    shapes = info.shapes if isinstance(info, ModelInfo) else param_shapes(info)
    for t in names:
        shape = shapes.get(f"blk.0.{t}.weight")
        if not shape:
            continue  # the loader names a missing tensor
        side = min(shape)
        if rank > side:
            raise InvalidValueError(f"--lora {rank}: above {t}'s smaller side ({side}); a rank "
                                    f"is at most {side} there")
    return names


def activation_bytes(cfg: Dims, n_ctx: int, n_ubatch: int) -> int:
    """A rough upper estimate of one training micro-batch's activations and gradients: the
    logits (3 copies), per layer the attention scores (3 copies) and the hidden states."""
    rows = n_ctx * n_ubatch
    per_layer = 3 * cfg.n_head * n_ctx * rows + rows * (12 * cfg.n_embd + 6 * cfg.n_ff)
    return 4 * (3 * cfg.n_vocab * rows + cfg.n_layer * per_layer)


def available_bytes() -> int | None:
    """The memory available to a new allocation (``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_ctx(cfg: Dims, n_ctx: int, n_ubatch: int, option: str = "--ctx") -> None:
    """ShapeError when ``n_ctx`` exceeds the model's context, OutOfMemoryError when the
    micro-batch's activations (:func:`activation_bytes`) exceed the available memory."""
    if 0 < cfg.n_ctx < n_ctx:
        raise ShapeError(f"{option} {n_ctx}: windows longer than the model's context of "
                         f"{cfg.n_ctx} tokens")
    need, have = activation_bytes(cfg, n_ctx, n_ubatch), available_bytes()
    if have is not None and need > have:
        raise OutOfMemoryError(f"{option} {n_ctx} with --ubatch {n_ubatch}: a micro-batch "
                               f"needs about {need / 1e9:.1f} GB of activations, "
                               f"{have / 1e9:.1f} GB are available (a smaller --ctx or "
                               f"--ubatch)")


def checkpoint_run(path: object, option: str = "--checkpoint") -> tuple[int, dict[str, Any]]:
    """The epochs a checkpoint holds and the run it records (``ctx``, ``batch``, ...), read
    from its keys (no tensor data); StateError when the file is missing or not a ggopt
    checkpoint."""
    spath = text_path(path, option)
    if not os.path.exists(spath):
        raise StateError(f"--resume: {option} {spath!r} does not exist (nothing to resume; "
                         f"drop --resume to start the run)")
    reader = open_reader(spath, f"{option} {spath!r}")
    field = reader.fields.get(STATE + "epoch")
    if field is None:
        raise StateError(f"--resume: {option} {spath!r} is not a ggopt training checkpoint")
    run = {k[len(RUN):]: f.contents() for k, f in reader.fields.items() if k.startswith(RUN)}
    return int(field.contents()), run
