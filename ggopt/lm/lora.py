"""LoRA adapters on a llama: ``y = W x + (alpha/r) B (A x)`` for the chosen projections, the
base frozen, and llama.cpp's adapter GGUF (``src/llama-adapter.cpp``).

``A`` ``(r, n_in)`` starts as PEFT's ``kaiming_uniform_(a=sqrt(5))``, i.e. uniform in
``[-1/sqrt(n_in), 1/sqrt(n_in)]`` (from ``np.random.default_rng(seed)``, targets in layer
order); ``B`` ``(n_out, r)`` starts at zero, so an untrained adapter leaves the model exactly
as it was. Attaching an adapter clears the base weights' PARAM flag: no gradient accumulators
and no AdamW moments are made for them, only for ``A`` and ``B``.

File layout (as llama.cpp reads it): ``general.type = "adapter"``, ``general.architecture =
"llama"``, ``adapter.type = "lora"``, ``adapter.lora.alpha`` FLOAT32; tensors
``<weight name>.lora_a`` ggml ``[n_in, r]`` and ``.lora_b`` ``[r, n_out]``, F32.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

import ggopt

from .. import F32, Context, Tensor
from ..backend import alloc_ctx_tensors, tensor_get, tensor_set
from ..errors import DTypeError, InvalidValueError, ShapeError
from ..io.atomic import atomic_path
from ..io.paths import text_path
from ..models.llama import LlamaModel, param_shapes
from ..models.llama.weights import check_finite, open_reader, tensor_table
from ..opt.checks import check_float32
from ..types import FLAG_PARAM

__all__ = ["TARGETS", "LoraAdapter", "parse_targets", "check_dropout", "create", "attach",
           "apply", "save", "load", "merged"]

#: The projections LoRA may adapt (llama.cpp's tensor names inside a block), in graph order.
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclasses.dataclass
class LoraAdapter:
    """``a[name]`` ggml ``[n_in, r]`` and ``b[name]`` ``[r, n_out]`` per adapted weight name
    (e.g. ``blk.3.attn_q.weight``), PARAM tensors on the model's backend."""

    alpha: float
    ctx: Context
    a: dict[str, Tensor]
    b: dict[str, Tensor]
    arch: str = "llama"  # the model's general.architecture (llama.cpp checks it matches)
    #: PEFT's ``lora_dropout``: the FineTuner drops the adapter's input out with this
    #: probability while training (:mod:`ggopt.lm.lora_dropout`); 0: none; never saved
    dropout: float = 0.0

    def scale(self, name: str) -> float:
        """``alpha / r`` of one weight (llama.cpp takes r from ``lora_b``); 1 when alpha is 0,
        as llama.cpp reads an adapter file without an alpha."""
        return self.alpha / self.b[name].ne[0] if self.alpha else 1.0

    def project(self, ctx: Context, name: str, w: Tensor, x: Tensor,
                x_adapter: Tensor | None = None) -> Tensor:
        """``W x + B (scale (A x))`` (``W x`` alone for a weight without an adapter);
        ``x_adapter`` (e.g. ``x`` dropped out) replaces ``x`` in ``A x``.

        The scale applies to the ``r``-row ``A x``, not the full-width ``B (A x)`` (the same
        value up to rounding, exactly it for a power-of-two scale): the scale and its gradient
        then cost nothing, and the sum's add fuses into the ``B`` product (``backend/fusion.py``).
        """
        g = ggopt
        y = g.mul_mat(ctx, w, x)
        if name not in self.a:
            return y
        low = g.scale(ctx, g.mul_mat(ctx, self.a[name], x if x_adapter is None else x_adapter),
                      self.scale(name))
        return g.add(ctx, y, g.mul_mat(ctx, self.b[name], low))

    def arrays(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Host copies ``(A (r, n_in), B (n_out, r))`` per weight name."""
        return {n: (tensor_get(self.a[n]).reshape(self.a[n].ne[1], self.a[n].ne[0]),
                    tensor_get(self.b[n]).reshape(self.b[n].ne[1], self.b[n].ne[0]))
                for n in self.a}

    def n_params(self) -> int:
        return sum(t.nelements() for t in (*self.a.values(), *self.b.values()))


def parse_targets(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"attn_q,attn_v"`` (or a sequence) -> checked target names, graph order kept as given.

    Raises
    ------
    InvalidValueError
        An empty list, an unknown or repeated name.
    """
    items = spec.split(",") if isinstance(spec, str) else spec
    if not isinstance(items, Sequence) or not all(isinstance(n, str) for n in items):
        raise DTypeError(f"lora targets: expected a comma-separated str or a sequence of str, "
                         f"got {spec!r}")
    names = [n.strip() for n in items]
    bad = [n for n in names if n not in TARGETS]
    if not names or bad or len(set(names)) != len(names):
        raise InvalidValueError(f"lora targets: expected distinct names from {','.join(TARGETS)}"
                                f", got {','.join(names)!r}")
    return tuple(names)


def check_dropout(p: object, where: str) -> float:
    """``p`` as a float in ``[0, 1)`` (a LoRA dropout); InvalidValueError otherwise."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or \
            not 0.0 <= float(p) < 1.0:
        raise InvalidValueError(f"{where}: the LoRA dropout must be a number in [0, 1), got "
                                f"{p!r}")
    return float(p)


def _alloc(net: LlamaModel, shapes: dict[str, tuple[tuple[int, int], tuple[int, int]]],
           alpha: float) -> LoraAdapter:
    ctx = Context()
    a, b = {}, {}
    for name, (sa, sb) in shapes.items():
        a[name] = ggopt.set_name(ctx.new_tensor_2d(F32, sa[1], sa[0]), name + ".lora_a")
        b[name] = ggopt.set_name(ctx.new_tensor_2d(F32, sb[1], sb[0]), name + ".lora_b")
        ggopt.set_param(a[name])
        ggopt.set_param(b[name])
    alloc_ctx_tensors(ctx, net.sched.get_backend(0))
    return LoraAdapter(float(np.float32(alpha)), ctx, a, b, net.cfg.arch)


def create(net: LlamaModel, rank: int, alpha: float, targets: Sequence[str] = TARGETS,
           seed: int = 0, dropout: float = 0.0) -> LoraAdapter:
    """A new adapter of rank ``rank`` on every block's ``targets`` (A random, B zero);
    ``dropout``: :attr:`LoraAdapter.dropout`.

    Raises
    ------
    InvalidValueError
        A rank below 1 or above a target's smaller side, an alpha that is not > 0 and finite
        in float32 (the file's type), a negative seed, a dropout outside [0, 1).
    """
    dropout = check_dropout(dropout, "lora")
    targets = parse_targets(targets)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidValueError(f"lora: the rank must be a positive int, got {rank!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidValueError(f"lora: the seed must be an int >= 0, got {seed!r}")
    alpha = check_float32(alpha, "lora: alpha", "", low=0.0, low_open=True)
    all_shapes = param_shapes(net.cfg)
    shapes = {}
    for i in range(net.cfg.n_layer):
        for t in targets:
            name = f"blk.{i}.{t}.weight"
            n_out, n_in = all_shapes[name]
            if rank > min(n_out, n_in):
                raise InvalidValueError(f"lora: rank {rank} exceeds {name}'s sides "
                                        f"{n_out} x {n_in}")
            shapes[name] = ((rank, n_in), (n_out, rank))
    ad = _alloc(net, shapes, alpha)
    ad.dropout = dropout
    rng = np.random.default_rng(seed)
    for name, ((r, n_in), (n_out, _)) in shapes.items():
        bound = 1.0 / math.sqrt(n_in)
        tensor_set(ad.a[name], rng.uniform(-bound, bound, (r, n_in)).astype(np.float32))
        tensor_set(ad.b[name], np.zeros((n_out, r), np.float32))
    return ad


def _check_fits(net: LlamaModel, adapter: LoraAdapter, where: str) -> None:
    """ShapeError unless every pair of ``adapter`` fits one of ``net``'s weights."""
    shapes = param_shapes(net.cfg)
    for name, a in adapter.a.items():
        b = adapter.b.get(name)
        if b is None or a.ne[1] != b.ne[0]:
            raise ShapeError(f"{where}: the adapter's {name}: lora_a ggml {list(a.ne[:2])} "
                             f"needs a lora_b of rank {a.ne[1]}, got "
                             f"{list(b.ne[:2]) if b is not None else 'none'}")
        want = shapes.get(name)
        if want is None or len(want) != 2 or a.ne[0] != want[1] or b.ne[1] != want[0]:
            raise ShapeError(f"{where}: the adapter's {name} (lora_a ggml "
                             f"{list(a.ne[:2])}, lora_b {list(b.ne[:2])}) does not fit this "
                             f"model's weight "
                             f"{list(want[::-1]) if want else 'of that name (none)'}")


def attach(net: LlamaModel, adapter: LoraAdapter) -> None:
    """Freeze the base (clear every weight's PARAM flag) and route the projections through
    ``adapter``.

    Raises
    ------
    DTypeError
        ``adapter`` is not a :class:`LoraAdapter`.
    ShapeError
        An adapted weight that ``net`` lacks or whose shape does not fit (an adapter made for
        another model), before ``net`` changes.
    """
    if not isinstance(adapter, LoraAdapter):
        raise DTypeError(f"lora attach: expected a LoraAdapter, got {type(adapter).__name__}")
    _check_fits(net, adapter, "lora attach")
    for t in net.params.values():
        t.flags &= ~FLAG_PARAM
    net.projection = adapter.project


def apply(net: LlamaModel, adapters: Sequence[tuple[LoraAdapter, float]]) -> None:
    """Run ``net`` with several adapters at once, each at its own strength (llama.cpp's
    ``--lora FILE`` = strength 1, ``--lora-scaled FILE S``): ``y = W x + sum_i s_i
    (alpha_i / r_i) B_i (A_i x)``. For inference: nothing is frozen or made trainable.

    Raises
    ------
    DTypeError
        An entry that is not ``(LoraAdapter, float)``.
    ShapeError
        An adapter that does not fit ``net`` (as :func:`attach`), before ``net`` changes.
    """
    pairs = []
    for entry in adapters:
        if not (isinstance(entry, tuple) and len(entry) == 2
                and isinstance(entry[0], LoraAdapter)
                and isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool)):
            raise DTypeError(f"lora apply: expected (LoraAdapter, strength) pairs, got "
                             f"{entry!r:.80}")
        check_finite(np.array([entry[1]], np.float32), "strength", "lora apply")
        pairs.append((entry[0], float(entry[1])))
    for adapter, _ in pairs:  # every shape checked before net changes
        _check_fits(net, adapter, "lora apply")

    def project(ctx: Context, name: str, w: Tensor, x: Tensor) -> Tensor:
        g = ggopt
        y = g.mul_mat(ctx, w, x)
        for adapter, strength in pairs:
            if name in adapter.a:
                low = g.scale(ctx, g.mul_mat(ctx, adapter.a[name], x),
                              strength * adapter.scale(name))
                y = g.add(ctx, y, g.mul_mat(ctx, adapter.b[name], low))
        return y

    net.projection = project


class _Merged(Mapping[str, np.ndarray]):
    def __init__(self, weights: Mapping[str, np.ndarray], adapter: LoraAdapter) -> None:
        self.weights, self.adapter = weights, adapter
        self.pairs = adapter.arrays()

    def __getitem__(self, name: str) -> np.ndarray:
        w = self.weights[name]
        if name not in self.pairs:
            return w
        a, b = self.pairs[name]
        if not isinstance(w, np.ndarray) or w.shape != (b.shape[0], a.shape[1]):
            got = w.shape if isinstance(w, np.ndarray) else type(w).__name__
            raise ShapeError(f"lora merged: weight {name!r}: expected an array of shape "
                             f"{(b.shape[0], a.shape[1])} (the adapter's), got {got}")
        delta = self.adapter.scale(name) * (b.astype(np.float64) @ a.astype(np.float64))
        return (w.astype(np.float64) + delta).astype(np.float32)

    def __contains__(self, name: object) -> bool:  # without computing the weight
        return name in self.weights

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


def merged(weights: Mapping[str, np.ndarray], adapter: LoraAdapter) -> Mapping[str, np.ndarray]:
    """``W + scale B A`` for the adapted weights (float64 product, rounded to float32); the
    others as given (the same arrays). Each merged weight is computed when it is looked up
    (``dict(merged(...))`` for all of them at once). ShapeError when an adapted weight is
    missing (here) or of another shape than the adapter's (when it is looked up)."""
    missing = [name for name in adapter.a if name not in weights]
    if missing:
        raise ShapeError(f"lora merged: weight {missing[0]!r}: expected an array of the "
                         f"adapter's shape, got none")
    return _Merged(weights, adapter)


def save(path: str | os.PathLike[str], adapter: LoraAdapter, arch: str | None = None) -> None:
    """Write llama.cpp's LoRA adapter GGUF (atomically), for ``arch`` (default: the
    architecture of the model the adapter was made for).

    Raises
    ------
    InvalidValueError
        A NaN or infinite value in the adapter (training diverged), before anything is
        written.
    """
    arrays = adapter.arrays()
    for name, (a, b) in arrays.items():
        check_finite(a, name + ".lora_a", "lora save (training diverged?)")
        check_finite(b, name + ".lora_b", "lora save (training diverged?)")
    with atomic_path(text_path(path, "lora save")) as tmp:
        writer = GGUFWriter(tmp, arch or adapter.arch)
        try:
            writer.add_key_value("general.type", "adapter", GGUFValueType.STRING)
            writer.add_key_value("adapter.type", "lora", GGUFValueType.STRING)
            writer.add_key_value("adapter.lora.alpha", adapter.alpha, GGUFValueType.FLOAT32)
            for name, (a, b) in arrays.items():
                writer.add_tensor(name + ".lora_a", a)
                writer.add_tensor(name + ".lora_b", b)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()


def _string(fields: Mapping[str, Any], key: str, where: str) -> str:
    field = fields.get(key)
    if field is None or list(field.types) != [GGUFValueType.STRING]:
        raise InvalidValueError(f"{where}: key {key} must be a string")
    value: str = field.contents()
    return value


def load(path: str | os.PathLike[str], net: LlamaModel) -> LoraAdapter:
    """Read a llama.cpp LoRA GGUF made for ``net``'s shapes (F32 or F16 tensors).

    Raises
    ------
    GgoptError
        Not an adapter file, alpha not a finite FLOAT32, no tensors, a tensor for no block
        projection of this model (ggopt applies adapters to :data:`TARGETS` only), a missing
        half of a pair, shapes that do not fit the weight or a rank of 0, another tensor type,
        a NaN or infinite value.

    An alpha of 0 means a scale of 1, as llama.cpp applies it.
    """
    where = f"lora adapter {text_path(path, 'lora load')!r}"
    reader = open_reader(os.fspath(path), where)
    fields = dict(reader.fields)
    for key, want in (("general.type", "adapter"), ("adapter.type", "lora"),
                      ("general.architecture", net.cfg.arch)):
        got = _string(fields, key, where)
        if got != want:
            raise InvalidValueError(f"{where}: {key} is {got!r}, expected {want!r}")
    alpha_field = reader.fields.get("adapter.lora.alpha")
    if alpha_field is None or list(alpha_field.types) != [GGUFValueType.FLOAT32]:
        raise DTypeError(f"{where}: adapter.lora.alpha must be a FLOAT32 (llama.cpp asserts)")
    alpha = float(alpha_field.contents())
    if not math.isfinite(alpha):
        raise InvalidValueError(f"{where}: adapter.lora.alpha is {alpha}; expected a finite "
                                f"number")
    table = tensor_table(reader, where)
    if not table:
        raise ShapeError(f"{where}: the adapter holds no tensors (nothing to apply or train)")
    shapes_all = param_shapes(net.cfg)
    adaptable = {f"blk.{i}.{t}.weight" for i in range(net.cfg.n_layer) for t in TARGETS}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for tname, t in table.items():
        base, _, half = tname.rpartition(".")
        if half not in ("lora_a", "lora_b") or base not in adaptable:
            raise ShapeError(f"{where}: tensor {tname!r} adapts no weight ggopt adapts (the "
                             f"blocks' {', '.join(TARGETS)} of this model's {net.cfg.n_layer} "
                             f"layers)")
        qtype = GGMLQuantizationType(int(t.tensor_type))
        if qtype not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raise DTypeError(f"{where}: tensor {tname!r} has type {qtype.name}; expected F32 "
                             f"or F16")
        ne = [int(d) for d in t.shape]
        arrays.setdefault(base, {})[half] = np.asarray(t.data, np.float32).reshape(ne[::-1])
        check_finite(arrays[base][half], tname, where)
    shapes = {}
    for base, pair in arrays.items():
        if len(pair) != 2:
            raise ShapeError(f"{where}: {base} has only its {next(iter(pair))}")
        n_out, n_in = shapes_all[base]
        a, b = pair["lora_a"], pair["lora_b"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != n_in or b.shape[0] != n_out or \
                a.shape[0] != b.shape[1] or a.shape[0] < 1:
            raise ShapeError(f"{where}: {base}: lora_a ggml {list(a.shape[::-1])} and lora_b "
                             f"{list(b.shape[::-1])} do not fit a [{n_in}, {n_out}] weight "
                             f"(expected [{n_in}, r] and [r, {n_out}], r >= 1)")
        shapes[base] = (a.shape, b.shape)
    ad = _alloc(net, shapes, alpha)
    for base, pair in arrays.items():
        tensor_set(ad.a[base], np.ascontiguousarray(pair["lora_a"]))
        tensor_set(ad.b[base], np.ascontiguousarray(pair["lora_b"]))
    return ad
