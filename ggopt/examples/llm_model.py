"""A byte-level llama model: hyper-parameters, weights, and llama.cpp's forward graph.

The graph is llama.cpp's ``llm_build_llama`` for training: token embedding, ``n_layer`` blocks
of rms_norm -> attention (rope in NORMAL mode, causal mask, grouped-query heads) -> rms_norm ->
SwiGLU feed-forward, a final rms_norm and the output projection. A micro-batch holds ``n_seq``
whole sequences of ``n_ctx`` tokens; attention runs per sequence (``[n_ctx, n_ctx]`` scores
per head and sequence, one causal mask broadcast over both).

Weights use llama.cpp's GGUF tensor names and ggml shapes: a weight applied as ``y = W x``
with ``W`` of NumPy shape ``(out, in)`` is ggml ``[in, out]``. Only ggopt's public API is used.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import ggopt

from .. import F32, I32, Context, Tensor
from ..backend import Scheduler, alloc_ctx_tensors, tensor_get, tensor_set
from ..errors import DTypeError, ShapeError

__all__ = ["N_VOCAB", "Config", "LlamaModel", "Inputs", "param_shapes", "init_weights",
           "build_model", "make_inputs", "build_logits", "set_weights", "get_weights"]

N_VOCAB = 256  # byte-level tokens


@dataclasses.dataclass(frozen=True)
class Config:
    """Hyper-parameters (llama.cpp's ``llama.*`` GGUF keys)."""

    n_ctx: int = 128
    n_embd: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 384
    n_vocab: int = N_VOCAB
    eps: float = 1e-5
    freq_base: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ShapeError(f"llm config: {name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head:
            raise ShapeError(f"llm config: the {self.n_head} heads must divide n_embd="
                             f"{self.n_embd} (head size n_embd/n_head)")
        if self.n_head % self.n_head_kv:
            raise ShapeError(f"llm config: the {self.n_head_kv} KV heads must divide the "
                             f"{self.n_head} query heads (grouped-query attention)")
        if self.head_dim % 2:
            raise ShapeError(f"llm config: the head size n_embd/n_head={self.head_dim} must be "
                             f"even (rope turns pairs of dimensions)")
        if not (self.eps > 0 and self.freq_base > 0):
            raise ShapeError(f"llm config: eps and freq_base must be > 0, got {self.eps}, "
                             f"{self.freq_base}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every weight's llama.cpp name and NumPy shape ``(out, in)``, in GGUF order."""
    C, F, V, Ckv = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.n_embd_kv
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, C)}
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_norm.weight": (C,), b + "attn_q.weight": (C, C),
            b + "attn_k.weight": (Ckv, C), b + "attn_v.weight": (Ckv, C),
            b + "attn_output.weight": (C, C), b + "ffn_norm.weight": (C,),
            b + "ffn_gate.weight": (F, C), b + "ffn_up.weight": (F, C),
            b + "ffn_down.weight": (C, F),
        })
    shapes["output_norm.weight"] = (C,)
    shapes["output.weight"] = (V, C)
    return shapes


def init_weights(cfg: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded initial weights (GPT-2's scheme): matrices N(0, 0.02), the projections back into
    the residual stream (``attn_output``, ``ffn_down``) N(0, 0.02/sqrt(2 n_layer)), norms 1.

    Drawn in :func:`param_shapes` order from ``np.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(seed)
    out = {}
    resid_sd = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
            continue
        sd = resid_sd if name.endswith(("attn_output.weight", "ffn_down.weight")) else 0.02
        out[name] = (rng.standard_normal(shape) * sd).astype(np.float32)
    return out


@dataclasses.dataclass
class Inputs:
    """The static inputs of one micro-batch shape: ``tokens`` ``[n_ctx*n_seq]`` (I32),
    ``pos`` (I32, each sequence's positions 0..n_ctx-1) and the causal ``mask``
    ``[n_ctx, n_ctx]`` (F32, -inf above the diagonal)."""

    ctx: Context
    tokens: Tensor
    pos: Tensor
    mask: Tensor
    n_seq: int


@dataclasses.dataclass
class LlamaModel:
    """Weights allocated on the scheduler's first backend, under llama.cpp's names."""

    cfg: Config
    sched: Scheduler
    ctx: Context
    params: dict[str, Tensor]


def build_model(cfg: Config, sched: Scheduler) -> LlamaModel:
    """Create (uninitialised) weight tensors flagged as parameters; see :func:`set_weights`."""
    if not isinstance(sched, Scheduler):
        raise DTypeError(f"build_model: sched must be a Scheduler, got {type(sched).__name__}")
    ctx = Context()
    params = {}
    for name, shape in param_shapes(cfg).items():
        t = ggopt.set_name(ctx.new_tensor(F32, shape[::-1]), name)
        ggopt.set_param(t)
        params[name] = t
    alloc_ctx_tensors(ctx, sched.get_backend(0))
    return LlamaModel(cfg, sched, ctx, params)


def make_inputs(model: LlamaModel, n_seq: int) -> Inputs:
    """Allocate the inputs for micro-batches of ``n_seq`` sequences; positions and mask set."""
    if isinstance(n_seq, bool) or not isinstance(n_seq, int) or n_seq < 1:
        raise ShapeError(f"make_inputs: n_seq must be a positive int, got {n_seq!r}")
    T = model.cfg.n_ctx
    ctx = Context()
    tokens = ggopt.set_name(ctx.new_tensor_1d(I32, T * n_seq), "tokens")
    pos = ggopt.set_name(ctx.new_tensor_1d(I32, T * n_seq), "pos")
    mask = ggopt.set_name(ctx.new_tensor_2d(F32, T, T), "kq_mask")
    for t in (tokens, pos, mask):
        ggopt.set_input(t)
    alloc_ctx_tensors(ctx, model.sched.get_backend(0))
    tensor_set(pos, np.tile(np.arange(T, dtype=np.int32), n_seq))
    tensor_set(mask, np.triu(np.full((T, T), -np.inf, np.float32), 1))
    return Inputs(ctx, tokens, pos, mask, n_seq)


def build_logits(ctx: Context, model: LlamaModel, inp: Inputs) -> Tensor:
    """llama.cpp's graph in ``ctx``: logits ``[n_vocab, n_ctx*n_seq]``, flagged as output."""
    cfg, p, c, g = model.cfg, model.params, ctx, ggopt
    T, B, hd = cfg.n_ctx, inp.n_seq, cfg.head_dim
    N = T * B
    kq_scale = 1.0 / math.sqrt(hd)

    def norm(x: Tensor, w: Tensor) -> Tensor:
        return g.mul(c, g.rms_norm(c, x, cfg.eps), w)

    def heads(x: Tensor, n_head: int, rope: bool) -> Tensor:
        # [C, N] -> [hd, n_head, T, B] (roped) -> [hd, T, n_head, B]
        x = g.reshape_3d(c, x, hd, n_head, N)
        if rope:
            x = g.rope_ext(c, x, inp.pos, None, hd, g.ROPE_TYPE_NORMAL, 0, cfg.freq_base,
                           1.0, 0.0, 1.0, 32.0, 1.0)
        return g.permute(c, g.reshape_4d(c, x, hd, n_head, T, B), 0, 2, 1, 3)

    x = g.get_rows(c, p["token_embd.weight"], inp.tokens)                  # [C, N]
    for i in range(cfg.n_layer):
        w = {k.split(".")[2]: t for k, t in p.items() if k.startswith(f"blk.{i}.")}
        h = norm(x, w["attn_norm"])
        q = heads(g.mul_mat(c, w["attn_q"], h), cfg.n_head, True)         # [hd, T, H, B]
        k = heads(g.mul_mat(c, w["attn_k"], h), cfg.n_head_kv, True)      # [hd, T, Hkv, B]
        v = g.reshape_4d(c, g.mul_mat(c, w["attn_v"], h), hd, cfg.n_head_kv, T, B)
        kq = g.soft_max_ext(c, g.mul_mat(c, k, q), inp.mask, kq_scale, 0.0)  # [T, T, H, B]
        vt = g.cont(c, g.permute(c, v, 1, 2, 0, 3))                         # [T, hd, Hkv, B]
        kqv = g.mul_mat(c, vt, kq)                                          # [hd, T, H, B]
        cur = g.reshape_2d(c, g.cont(c, g.permute(c, kqv, 0, 2, 1, 3)), cfg.n_embd, N)
        x = g.add(c, x, g.mul_mat(c, w["attn_output"], cur))
        h = norm(x, w["ffn_norm"])
        ff = g.swiglu_split(c, g.mul_mat(c, w["ffn_gate"], h), g.mul_mat(c, w["ffn_up"], h))
        x = g.add(c, x, g.mul_mat(c, w["ffn_down"], ff))
    logits = g.mul_mat(c, p["output.weight"], norm(x, p["output_norm.weight"]))
    g.set_output(g.set_name(logits, "logits"))
    return logits


def set_weights(model: LlamaModel, weights: dict[str, np.ndarray], where: str) -> None:
    """Copy NumPy-order float32 weights in; names and shapes are all checked first."""
    expected = param_shapes(model.cfg)
    missing = [n for n in expected if n not in weights]
    if missing:
        raise ShapeError(f"{where}: missing tensors {', '.join(missing)}")
    for name, shape in expected.items():
        arr = weights[name]
        if arr.shape != shape:
            raise ShapeError(f"{where}: tensor {name!r}: expected ggml shape "
                             f"{list(shape[::-1])}, got {list(arr.shape[::-1])}")
        if arr.dtype != np.float32:
            raise DTypeError(f"{where}: tensor {name!r}: expected F32, got {arr.dtype}")
    for name, t in model.params.items():
        tensor_set(t, np.ascontiguousarray(weights[name]))


def get_weights(model: LlamaModel) -> dict[str, np.ndarray]:
    """Host copies of the weights, NumPy order, llama.cpp's names."""
    return {name: tensor_get(model.params[name]).reshape(shape)
            for name, shape in param_shapes(model.cfg).items()}
