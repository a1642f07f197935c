"""A frozen llama: matrices as the file stores them (``load(path, base_type="keep")``), or
converted to BF16 at load (``compute_type="bf16"``).

Kept, each matrix whose type ggopt computes with (F32, F16, BF16 and the block types of
:data:`ggopt.quants.QUANTIZED_TYPES`) becomes a tensor over the file's read-only memory map
(:func:`ggopt.quants.tensor_from_blocks`: no copy): every matrix type of
:data:`.weights.SUPPORTED_TYPES`. The 1-D tensors (norms, ``rope_freqs``) are dequantized into
F32 memory of their own.
With ``compute_type="bf16"`` the matrices that would be F32 (all of them unless kept; kept, the
file's F32 ones and those dequantized) are stored in BF16 instead, rounded once as ggml rounds
F32 to BF16. Nothing is a PARAM: the base is frozen, for inference or for LoRA (a quantized or
BF16 tensor never trains; a full fine-tune needs ``base_type="f32"``, ``compute_type="f32"``).

Non-finite weights are refused without dequantizing: a block's values are finite exactly when
its F16 scale (and minimum) are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ggopt

from ... import F32, Context, Tensor
from ...backend import Scheduler, alloc_ctx_tensors, tensor_set
from ...errors import InvalidValueError, StateError
from ...lowp import bf16_from_f32, widen
from ...quants import QUANTIZED_TYPES, dequantize, tensor_from_blocks
from ...types import BF16, FLAG_PARAM, GGType
from .config import Config
from .graph import LlamaModel, is_read_only, param_shapes
from .weights import ProgressBar, as_f32, check_finite

__all__ = ["BASE_TYPES", "MAPPABLE_TYPES", "map_model", "base_bytes", "check_trainable",
           "check_blocks_finite"]

#: ``load``'s ``base_type``: dequantize every weight to F32 (trainable) or keep the file's.
BASE_TYPES = ("f32", "keep")
#: The file types a kept matrix is mapped with, as they are.
MAPPABLE_TYPES = frozenset({GGType.F32, GGType.F16, GGType.BF16, *QUANTIZED_TYPES})
#: Byte offsets of the F16 scale (and minimum) inside one block of each type.
_SCALE_OFFSETS = {GGType.Q4_0: (0,), GGType.Q4_1: (0, 2), GGType.Q5_0: (0,),
                  GGType.Q5_1: (0, 2), GGType.Q8_0: (0,)}


def _mapped_type(t: Any, ndim: int, keep: bool, compute_type: str) -> GGType | None:
    """The GGType a file tensor is mapped as, or None when it is dequantized."""
    code = int(t.tensor_type)
    if not keep or ndim < 2 or code not in {int(q) for q in MAPPABLE_TYPES}:
        return None
    if code == int(GGType.F32) and compute_type == "bf16":
        return None  # converted to BF16
    return GGType(code)


def check_blocks_finite(raw: np.ndarray, qtype: GGType, name: str, where: str) -> None:
    """InvalidValueError when the F32 or block-type tensor ``raw`` (its bytes) holds a
    non-finite value (for a block type: a NaN or infinite F16 scale)."""
    if qtype == GGType.F32:
        check_finite(np.asarray(raw).view(np.float32), name, where)
        return
    if qtype.is_lowp:
        bits = np.asarray(raw).view(np.uint16 if qtype == GGType.BF16 else np.float16)
        check_finite(widen(qtype, bits), name, where)
        return
    offsets = _SCALE_OFFSETS.get(qtype)
    if offsets is None:  # a block type without a known scale layout: check its values
        check_finite(dequantize(np.asarray(raw), qtype), name, where)
        return
    blocks = np.asarray(raw).reshape(-1, qtype.size)
    for off in offsets:
        scales = np.ascontiguousarray(blocks[:, off:off + 2]).view(np.float16)
        bad = int(np.count_nonzero(~np.isfinite(scales)))
        if bad:
            raise InvalidValueError(f"{where}: tensor {name!r} has {bad} {qtype.name} block(s) "
                                    f"with a NaN or infinite scale")


def map_model(cfg: Config, sched: Scheduler, table: dict[str, Any], where: str,
              bar: ProgressBar | None = None, keep: bool = True,
              compute_type: str = "f32") -> LlamaModel:
    """The frozen model over ``table``'s (checked) tensors: with ``keep`` the matrices mapped
    where their type allows; with ``compute_type="bf16"`` the others stored in BF16.

    Raises
    ------
    StateError
        ``sched``'s first backend is not host memory (the map is).
    InvalidValueError
        A non-finite weight (checked for every tensor before anything is made).
    """
    backend = sched.get_backend(0)
    if not backend.is_host:
        raise StateError(f"{where}: base_type='keep' maps the file into host memory; the "
                         f"scheduler's first backend must be the CPU (got {backend.name})")
    shapes = param_shapes(cfg)
    kinds = {name: _mapped_type(table[name], len(shape), keep, compute_type)
             for name, shape in shapes.items()}
    owned: dict[str, np.ndarray] = {}
    converted: dict[str, np.ndarray] = {}  # BF16 bits of the matrices stored in BF16
    for i, (name, shape) in enumerate(shapes.items()):
        qtype = kinds[name]
        if qtype is None:
            arr = as_f32(table[name], shape)
            check_finite(arr, name, where)
            if compute_type == "bf16" and len(shape) == 2:
                converted[name] = bf16_from_f32(arr)
                check_finite(widen(BF16, converted[name]), name,
                             f"{where} (rounded to BF16: beyond BF16's range)")
            else:
                owned[name] = arr
        else:
            check_blocks_finite(table[name].data, qtype, name, where)
        if bar is not None:
            bar.update(i + 1, int(table[name].n_bytes))
    mapped_ctx, owned_ctx = Context(), Context()
    params: dict[str, Tensor] = {}
    for name, shape in shapes.items():
        qtype = kinds[name]
        if name in converted:  # the tensor's memory is the converted array (no second copy)
            params[name] = tensor_from_blocks(mapped_ctx, BF16, shape[::-1],
                                              converted[name].view(np.uint8), name)
        elif qtype is None:
            params[name] = ggopt.set_name(owned_ctx.new_tensor(F32, shape[::-1]), name)
        else:
            params[name] = tensor_from_blocks(mapped_ctx, qtype, shape[::-1],
                                              table[name].data, name)
    alloc_ctx_tensors(owned_ctx, backend)
    for name, arr in owned.items():
        tensor_set(params[name], np.ascontiguousarray(arr))
    return LlamaModel(cfg, sched, owned_ctx, params, compute_type=compute_type)


def base_bytes(net: LlamaModel) -> tuple[int, int, int]:
    """``(bytes the weights take, bytes they would take in F32, bytes of them mapped
    read-only from the file)``."""
    ts = list(net.params.values())
    return (sum(t.nbytes() for t in ts), 4 * sum(t.nelements() for t in ts),
            sum(t.nbytes() for t in ts if is_read_only(t)))


def check_trainable(net: LlamaModel, where: str) -> None:
    """StateError when a fine-tune of ``net`` would train nothing: no adapter is attached
    and no weight is a PARAM (a model loaded with ``base_type="keep"``)."""
    if net.projection is not None or any(t.flags & FLAG_PARAM for t in net.params.values()):
        return
    quantized = [n for n, t in net.params.items() if t.type.is_quantized]
    lowp = [n for n, t in net.params.items() if t.type.is_lowp]
    if lowp and not quantized:
        raise StateError(f"{where}: a full fine-tune of {net.params[lowp[0]].type.name} weights "
                         f"(e.g. {lowp[0]!r}; a model loaded with compute_type='bf16' or a kept "
                         f"F16/BF16 file is frozen): they never train. For a full fine-tune in "
                         f"BF16 load with base_type='f32', compute_type='f32' (F32 master "
                         f"weights) and pass FinetuneParams(compute_type='bf16'); or attach a "
                         f"LoRA adapter")
    if not quantized:
        raise StateError(f"{where}: no weight is a PARAM (a model loaded with "
                         f"base_type='keep' is frozen) and no adapter is attached: nothing "
                         f"would train")
    raise StateError(f"{where}: a full fine-tune of quantized weights ({len(quantized)} of "
                     f"them, e.g. {quantized[0]!r} is {net.params[quantized[0]].type.name}): a "
                     f"quantized tensor never trains. Load the model with base_type='f32' "
                     f"(dequantized) to train every weight, or attach a LoRA adapter")
