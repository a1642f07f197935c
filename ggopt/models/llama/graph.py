"""llama.cpp's llama graph (``llm_build_llama``): the one builder used by training,
evaluation and generation.

Token embedding, ``n_layer`` blocks of rms_norm -> attention (rope in NORMAL mode, causal mask,
grouped-query heads, scale ``1/sqrt(head_dim)`` or ``llama.attention.scale``) -> rms_norm ->
SwiGLU feed-forward, a final rms_norm and the output projection (``output.weight``, or
``token_embd.weight`` when tied). A batch holds ``n_seq`` whole sequences of ``n_tokens``
tokens; attention runs per sequence. With a :class:`KVCache` (one sequence), the graph first
copies the new tokens' roped keys and values into the cache's staging slots (``n_kv`` ..
``n_kv + n_tokens - 1``, a fixed place, so the graph's shape never changes), then attends to the
``n_kv`` slots followed by the staging ones through the mask; :meth:`KVCache.store` moves the
staged keys and values into their slots afterwards.

Weights use llama.cpp's GGUF tensor names and ggml shapes: a weight applied as ``y = W x``
with ``W`` of NumPy shape ``(out, in)`` is ggml ``[in, out]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

import ggopt

from ... import F32, I32, Context, Tensor
from ...backend import Scheduler, alloc_ctx_tensors, tensor_fill, tensor_set
from ...backend.buffer import buffer_of
from ...errors import DTypeError, ShapeError, StateError
from ...types import BF16
from .compute import check_compute_type
from .config import Config

__all__ = ["LlamaModel", "Projection", "Inputs", "KVCache", "Graph", "param_shapes",
           "init_weights", "build_model", "make_inputs", "make_cache", "build_logits",
           "build_graph", "set_masks", "set_segments", "set_weights", "is_read_only"]


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every weight's llama.cpp name and NumPy shape ``(out, in)``, in GGUF order, for the
    family of ``cfg.arch``."""
    C, F, V, Ckv, Cq, hd = (cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.n_embd_kv, cfg.n_embd_q,
                            cfg.head_dim)
    fam = cfg.family
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, C)}
    if cfg.rope_freqs:
        shapes["rope_freqs.weight"] = (hd // 2,)
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        shapes.update({b + "attn_norm.weight": (C,), b + "attn_q.weight": (Cq, C),
                       b + "attn_k.weight": (Ckv, C), b + "attn_v.weight": (Ckv, C)})
        if cfg.qkv_bias:
            shapes.update({b + "attn_q.bias": (Cq,), b + "attn_k.bias": (Ckv,),
                           b + "attn_v.bias": (Ckv,)})
        if fam.qk_norm:
            shapes.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
        shapes[b + "attn_output.weight"] = (C, Cq)
        if fam.post_norms:
            shapes[b + "post_attention_norm.weight"] = (C,)
        shapes.update({b + "ffn_norm.weight": (C,), b + "ffn_gate.weight": (F, C),
                       b + "ffn_up.weight": (F, C), b + "ffn_down.weight": (C, F)})
        if fam.post_norms:
            shapes[b + "post_ffw_norm.weight"] = (C,)
    shapes["output_norm.weight"] = (C,)
    if not cfg.tied_output:
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
            out[name] = np.zeros(shape, np.float32) if name.endswith(".bias") else \
                np.ones(shape, np.float32)
            continue
        sd = resid_sd if name.endswith(("attn_output.weight", "ffn_down.weight")) else 0.02
        out[name] = (rng.standard_normal(shape) * sd).astype(np.float32)
    return out


@dataclasses.dataclass
class Inputs:
    """The static inputs of one batch shape: ``tokens`` ``[n_tokens*n_seq]`` (I32), ``pos``
    (I32 positions) and the ``mask`` ``[n_kv + n_tokens, n_tokens]`` (F32, 0 or -inf); for a
    model with sliding-window layers, their mask ``mask_swa`` (the same shape; see
    :func:`set_masks`). ``packed``: one mask per sequence, ``[n_tokens, n_tokens, 1, n_seq]``,
    set with the positions by :func:`set_segments` for each batch."""

    ctx: Context
    tokens: Tensor
    pos: Tensor
    mask: Tensor
    n_seq: int
    n_tokens: int
    mask_swa: Tensor | None = None
    packed: bool = False


#: ``project(ctx, weight name, weight, x)``: what replaces ``mul_mat(weight, x)`` for a block's
#: seven projections (e.g. a LoRA adapter's ``W x + s B(A x)``, :mod:`ggopt.lm.lora`).
Projection = Callable[[Context, str, Tensor, Tensor], Tensor]


@dataclasses.dataclass
class LlamaModel:
    """Weights allocated on the scheduler's first backend, under llama.cpp's names; with a
    ``projection`` every graph applies it to the blocks' projections. ``compute_type="bf16"``
    rounds the F32 weight matrices to BF16 in every graph (:mod:`.compute`)."""

    cfg: Config
    sched: Scheduler
    ctx: Context
    params: dict[str, Tensor]
    projection: Projection | None = None
    #: the default ``compute_type`` of its graphs (:mod:`.compute`)
    compute_type: str = "f32"
    #: its graphs' forward ops in ggml's float order by default (llama.cpp's bits; the loader
    #: sets it for ``base_type="keep"``): see :func:`build_graph`
    ggml_order: bool = False


@dataclasses.dataclass
class KVCache:
    """Roped keys ``[head_dim, n_kv + n_stage, n_head_kv]`` and transposed values ``[n_kv +
    n_stage, head_dim, n_head_kv]`` per layer: ``n_kv`` slots of one sequence (zeros until
    stored) and ``n_stage`` staging slots for the tokens of one step."""

    ctx: Context
    k: list[Tensor]
    v: list[Tensor]
    n_kv: int
    n_stage: int

    def store(self, n: int, first: int) -> None:
        """Move the ``n`` staged keys and values into slots ``first, first+1, ...``."""
        if first < 0 or first + n > self.n_kv or n > self.n_stage:
            raise ShapeError(f"kv cache: slots {first}..{first + n - 1} outside "
                             f"0..{self.n_kv - 1}")
        s = self.n_kv
        for cache_k, cache_v in zip(self.k, self.v, strict=True):
            kk, vv = buffer_of(cache_k).view(cache_k), buffer_of(cache_v).view(cache_v)
            kk[0, :, first:first + n, :] = kk[0, :, s:s + n, :]
            vv[0, :, :, first:first + n] = vv[0, :, :, s:s + n]

    def clear(self) -> None:
        """Zero every slot (a new cache's state)."""
        for t in (*self.k, *self.v):
            tensor_fill(t, 0.0)


@dataclasses.dataclass
class Graph:
    """A built forward graph: its logits and, with a cache, the copies into the staging slots
    (to be expanded into the graph before the logits, layer by layer)."""

    logits: Tensor
    inputs: Inputs
    writes: list[Tensor]


def build_model(cfg: Config, sched: Scheduler) -> LlamaModel:
    """Create (uninitialised) weight tensors flagged as parameters; see :func:`set_weights`."""
    if not isinstance(sched, Scheduler):
        raise DTypeError(f"build_model: sched must be a Scheduler, got {type(sched).__name__}")
    ctx = Context()
    params = {}
    for name, shape in param_shapes(cfg).items():
        t = ggopt.set_name(ctx.new_tensor(F32, shape[::-1]), name)
        if name != "rope_freqs.weight":
            ggopt.set_param(t)
        params[name] = t
    alloc_ctx_tensors(ctx, sched.get_backend(0))
    return LlamaModel(cfg, sched, ctx, params)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(f"make_inputs: {name} must be a positive int, got {value!r}")
    return value


def make_inputs(model: LlamaModel, n_seq: int, n_tokens: int | None = None,
                n_kv: int = 0, packed: bool = False) -> Inputs:
    """Allocate the inputs for ``n_seq`` sequences of ``n_tokens`` (default ``n_ctx``) tokens.

    Without a cache (``n_kv == 0``) positions ``0..n_tokens-1`` and the causal mask are set
    here; with one (``n_seq == 1``) the caller sets both for each step. ``packed``: each
    sequence holds several independent ones (packed chat windows); the positions and a mask
    per sequence are set by :func:`set_segments` for each batch (data, not graph constants:
    one graph serves every window).
    """
    n_seq = _positive("n_seq", n_seq)
    T = _positive("n_tokens", model.cfg.n_ctx if n_tokens is None else n_tokens)
    if n_kv and (n_seq != 1 or packed):
        raise ShapeError("make_inputs: a kv cache holds one sequence (n_seq 1, not packed)")
    ctx = Context()
    tokens = ggopt.set_name(ctx.new_tensor_1d(I32, T * n_seq), "tokens")
    pos = ggopt.set_name(ctx.new_tensor_1d(I32, T * n_seq), "pos")

    def new_mask(name: str) -> Tensor:
        t = ctx.new_tensor(F32, (T, T, 1, n_seq)) if packed else \
            ctx.new_tensor_2d(F32, n_kv + T, T)
        return ggopt.set_name(t, name)

    mask = new_mask("kq_mask")
    mask_swa = new_mask("kq_mask_swa") if any(model.cfg.swa_layers) else None
    for t in (tokens, pos, mask, mask_swa):
        if t is not None:
            ggopt.set_input(t)
    alloc_ctx_tensors(ctx, model.sched.get_backend(0))
    inp = Inputs(ctx, tokens, pos, mask, n_seq, T, mask_swa, packed)
    if packed:
        set_segments(inp, model.cfg, np.zeros((n_seq, T), np.int32))
    elif not n_kv:
        tensor_set(pos, np.tile(np.arange(T, dtype=np.int32), n_seq))
        ar = np.arange(T, dtype=np.int64)
        set_masks(inp, model.cfg, np.triu(np.full((T, T), -np.inf, np.float32), 1), ar, ar)
    return inp


def set_masks(inp: Inputs, cfg: Config, mask: np.ndarray, kv_pos: np.ndarray,
              q_pos: np.ndarray) -> None:
    """Set ``inp.mask`` to ``mask`` (``[n_tokens, n_kv + n_tokens]``, 0 or -inf) and, for a
    model with sliding-window layers, ``inp.mask_swa`` to ``mask`` with also every key at
    position ``p0`` hidden from a query at ``p1`` when ``p1 - p0 >= n_swa`` (llama.cpp's
    ``LLAMA_SWA_TYPE_STANDARD``); ``kv_pos``, ``q_pos``: the keys' and the queries'
    positions."""
    tensor_set(inp.mask, mask)
    if inp.mask_swa is not None:
        far = (q_pos[:, None] - kv_pos[None, :]) >= cfg.n_swa
        tensor_set(inp.mask_swa, np.where(far, np.float32(-np.inf), mask).astype(np.float32))


def set_segments(inp: Inputs, cfg: Config, segments: np.ndarray) -> None:
    """Positions and masks of a packed batch (:func:`make_inputs` with ``packed=True``) from
    ``segments`` ``(n_seq, n_tokens)``: per token the id (>= 0) of the sequence it belongs
    to, each sequence a contiguous run, -1 for padding. A token attends causally to its own
    sequence only (a block-diagonal causal mask, as llama.cpp separates sequences by id in
    one batch; a sliding window counts within the sequence) and its rope position restarts at
    0 where its sequence starts; a padding token attends to itself alone at position 0 (no
    row of the softmax is empty, so nothing is NaN)."""
    if not inp.packed:
        raise ShapeError("set_segments: the inputs are not packed (make_inputs(packed=True))")
    seg = np.asarray(segments)
    B, T = inp.n_seq, inp.n_tokens
    if seg.shape != (B, T) or seg.dtype.kind not in "iu":
        raise ShapeError(f"set_segments: expected integer segments of shape {(B, T)}, got "
                         f"{seg.dtype} {seg.shape}")
    ar = np.arange(T)
    start = np.zeros((B, T), np.int64)  # where each token's run of equal ids starts
    new = np.ones((B, T), bool)
    new[:, 1:] = seg[:, 1:] != seg[:, :-1]
    start[new] = np.broadcast_to(ar, (B, T))[new]
    start = np.maximum.accumulate(start, axis=1)
    pad = seg < 0
    pos = np.where(pad, 0, ar[None, :] - start).astype(np.int32)
    same = (seg[:, :, None] == seg[:, None, :]) & ~pad[:, :, None]
    visible = (same & (ar[None, None, :] <= ar[None, :, None])) | np.eye(T, dtype=bool)[None]
    tensor_set(inp.pos, pos.reshape(-1))
    mask = np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    tensor_set(inp.mask, mask.reshape(B, 1, T, T))
    if inp.mask_swa is not None:  # within a sequence, the position gap is the index gap
        far = (ar[:, None] - ar[None, :]) >= cfg.n_swa
        tensor_set(inp.mask_swa, np.where(far[None], np.float32(-np.inf), mask).astype(
            np.float32).reshape(B, 1, T, T))


def make_cache(model: LlamaModel, n_kv: int, n_stage: int = 1) -> KVCache:
    """A zeroed cache of ``n_kv`` slots and ``n_stage`` staging slots per layer on the
    model's backend."""
    cfg, ctx = model.cfg, Context()
    hd, hkv, n = cfg.head_dim, cfg.n_head_kv, n_kv + n_stage
    k = [ctx.new_tensor_3d(F32, hd, n, hkv) for _ in range(cfg.n_layer)]
    v = [ctx.new_tensor_3d(F32, n, hd, hkv) for _ in range(cfg.n_layer)]
    for t in (*k, *v):
        ggopt.set_input(t)
    alloc_ctx_tensors(ctx, model.sched.get_backend(0))
    cache = KVCache(ctx, k, v, n_kv, n_stage)
    cache.clear()
    return cache


def _stage(c: Context, cache: KVCache, i: int, k: Tensor, vt: Tensor,
           writes: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Copy layer ``i``'s new keys ``[hd, T, Hkv, 1]`` and values ``[T, hd, Hkv, 1]`` into the
    staging slots; return the views of slots ``0 .. n_kv + T - 1`` that attention reads."""
    g, T, n = ggopt, k.ne[1], cache.n_kv
    ck, cv = cache.k[i], cache.v[i]
    hd, hkv = ck.ne[0], ck.ne[2]
    writes.append(g.cpy(c, k, g.view_4d(c, ck, hd, T, hkv, 1, ck.nb[1], ck.nb[2], ck.nb[3],
                                        n * ck.nb[1])))
    writes.append(g.cpy(c, vt, g.view_4d(c, cv, T, hd, hkv, 1, cv.nb[1], cv.nb[2], cv.nb[3],
                                         n * cv.nb[0])))
    k_all = g.view_3d(c, ck, hd, n + T, hkv, ck.nb[1], ck.nb[2], 0)
    v_all = g.view_3d(c, cv, n + T, hd, hkv, cv.nb[1], cv.nb[2], 0)
    return k_all, v_all


def build_logits(ctx: Context, model: LlamaModel, inp: Inputs, output: bool = True,
                 compute_type: str | None = None, ggml_order: bool | None = None) -> Tensor:
    """The logits ``[n_vocab, n_tokens*n_seq]`` of :func:`build_graph` without a cache;
    ``output=False`` for a loss over them (the logits then die at their gradient)."""
    return build_graph(ctx, model, inp, output=output, compute_type=compute_type,
                       ggml_order=ggml_order).logits


def _rounded(c: Context, params: dict[str, Tensor], compute_type: str
             ) -> Callable[[str], Tensor]:
    """``weight(name)``: the weight a product uses. With ``"bf16"`` an F32 matrix is replaced
    by its BF16 copy, one ``cpy`` node per weight in this graph (made on first use)."""
    copies: dict[str, Tensor] = {}

    def weight(name: str) -> Tensor:
        w = params[name]
        if compute_type == "f32" or w.type is not F32:
            return w
        if name not in copies:
            copies[name] = ggopt.cpy(c, w, ggopt.set_name(c.new_tensor(BF16, w.ne),
                                                          name + ".bf16"))
        return copies[name]

    return weight


def build_graph(ctx: Context, model: LlamaModel, inp: Inputs, cache: KVCache | None = None,
                last_only: bool = False, output: bool = True,
                compute_type: str | None = None, ggml_order: bool | None = None) -> Graph:
    """llama.cpp's graph in ``ctx``: logits ``[n_vocab, n_tokens*n_seq]`` (only the last
    token's with ``last_only``), flagged as output unless ``output=False`` (an output is
    never freed nor overwritten: the planner keeps the logits to the end of the graph).
    ``compute_type`` (default: the model's): ``"bf16"`` rounds every F32 weight matrix to BF16
    once in this graph for its products (:mod:`.compute`). ``ggml_order`` (default: the
    model's): the RMS norms, ropes, softmaxes, SwiGLUs, attention products and the products
    of F32, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and Q2_K ... Q6_K weights in ggml's float order
    (:func:`ggopt.set_ggml_order`, docs/ggml-order.md); F16/BF16 weights, a projection's
    products and the BF16 compute type keep ggopt's."""
    cfg, p, c, g = model.cfg, model.params, ctx, ggopt
    ordered = model.ggml_order if ggml_order is None else bool(ggml_order)

    def go(t: Tensor) -> Tensor:  # t in ggml's order, where this graph asks and it has one
        return g.set_ggml_order(t) if ordered and g.has_ggml_order(t) else t

    def weight_product(w: Tensor, x: Tensor) -> Tensor:
        y = g.mul_mat(c, w, x)
        return go(y) if w.type.is_quantized or w.type is F32 else y

    fam = cfg.family
    weight = _rounded(c, p, check_compute_type(
        model.compute_type if compute_type is None else compute_type, "build_graph"))
    T, B, hd = inp.n_tokens, inp.n_seq, cfg.head_dim
    N = T * B
    freqs = p.get("rope_freqs.weight")
    if cache is not None and (inp.mask.ne[0] != cache.n_kv + T or T > cache.n_stage):
        raise ShapeError(f"build_logits: the mask covers {inp.mask.ne[0]} slots, the cache "
                         f"{cache.n_kv} + {T} new tokens ({cache.n_stage} staging slots)")
    if any(cfg.swa_layers) and inp.mask_swa is None:
        raise ShapeError("build_logits: the model has sliding-window layers and the inputs "
                         "no mask_swa (make them with make_inputs for this model)")

    def norm(x: Tensor, w: Tensor) -> Tensor:
        return g.mul(c, go(g.rms_norm(c, x, cfg.eps)), w)

    def heads(x: Tensor, n_head: int, i: int, qk_norm: Tensor | None) -> Tensor:
        # [hd*n_head, N] -> [hd, n_head, T, B] (normed per head, roped) -> [hd, T, n_head, B]
        x = g.reshape_3d(c, x, hd, n_head, N)
        if qk_norm is not None:
            x = norm(x, qk_norm)
        swa = cfg.is_swa(i)
        x = go(g.rope_ext(c, x, inp.pos, freqs, hd, fam.rope_type, 0, cfg.layer_freq_base(i),
                          1.0 if swa else cfg.freq_scale, 0.0, 1.0, 32.0, 1.0))
        return g.permute(c, g.reshape_4d(c, x, hd, n_head, T, B), 0, 2, 1, 3)

    def mm(i: int, name: str, x: Tensor) -> Tensor:  # a block's projection of x (+ its bias)
        key = f"blk.{i}.{name}.weight"
        if model.projection is None:
            y = weight_product(weight(key), x)
        else:
            y = model.projection(c, key, weight(key), x)
        bias = p.get(f"blk.{i}.{name}.bias")
        return y if bias is None else g.add(c, y, bias)

    writes: list[Tensor] = []
    x = g.get_rows(c, p["token_embd.weight"], inp.tokens)                  # [C, N]
    if fam.embd_scale:
        x = g.scale(c, x, float(np.sqrt(np.float32(cfg.n_embd))))
    for i in range(cfg.n_layer):
        w = {k.split(".")[2]: t for k, t in p.items() if k.startswith(f"blk.{i}.")
             and k.endswith(".weight")}
        h = norm(x, w["attn_norm"])
        q = heads(mm(i, "attn_q", h), cfg.n_head, i, w.get("attn_q_norm"))  # [hd, T, H, B]
        k = heads(mm(i, "attn_k", h), cfg.n_head_kv, i, w.get("attn_k_norm"))
        v = g.reshape_4d(c, mm(i, "attn_v", h), hd, cfg.n_head_kv, T, B)
        vt = g.cont(c, g.permute(c, v, 1, 2, 0, 3))                         # [T, hd, Hkv, B]
        if cache is not None:
            k, vt = _stage(c, cache, i, k, vt, writes)
        scale = cfg.kq_scale
        if fam.scale_q:  # gemma3 scales Q, then the softmax by 1
            q, scale = g.scale(c, q, scale), 1.0
        mask = inp.mask_swa if cfg.is_swa(i) else inp.mask
        kq = g.soft_max_ext(c, go(g.mul_mat(c, k, q)), mask, scale, 0.0)
        kqv = g.mul_mat(c, vt, kq)                                          # [hd, T, H, B]
        if ordered:  # over llama.cpp's KV cache, padded to a multiple of 8 (ggml-order.md)
            kq, kqv = (g.set_ggml_order(kq, kv_padded=True),
                       g.set_ggml_order(kqv, kv_padded=True))
        cur = g.reshape_2d(c, g.cont(c, g.permute(c, kqv, 0, 2, 1, 3)), cfg.n_embd_q, N)
        cur = mm(i, "attn_output", cur)
        if fam.post_norms:
            cur = norm(cur, w["post_attention_norm"])
        x = g.add(c, x, cur)
        h = norm(x, w["ffn_norm"])
        if fam.ffn_gelu:
            ff = g.mul(c, g.gelu(c, mm(i, "ffn_gate", h)), mm(i, "ffn_up", h))
        else:
            ff = go(g.swiglu_split(c, mm(i, "ffn_gate", h), mm(i, "ffn_up", h)))
        cur = mm(i, "ffn_down", ff)
        if fam.post_norms:
            cur = norm(cur, w["post_ffw_norm"])
        x = g.add(c, x, cur)
    if last_only:
        x = g.view_2d(c, x, cfg.n_embd, 1, x.nb[1], (N - 1) * x.nb[1])
    out_w = weight("token_embd.weight" if cfg.tied_output else "output.weight")
    logits = weight_product(out_w, norm(x, p["output_norm.weight"]))
    if cfg.softcap:
        logits = g.scale(c, g.tanh(c, g.scale(c, logits, 1.0 / cfg.softcap)), cfg.softcap)
    g.set_name(logits, "logits")
    if output:
        g.set_output(logits)
    return Graph(logits, inp, writes)


def set_weights(model: LlamaModel, weights: Mapping[str, np.ndarray], where: str) -> None:
    """Copy NumPy-order float32 weights in; names and shapes are all checked first.

    StateError for a model that keeps the file's weights (``base_type="keep"``: read-only).
    """
    kept = [n for n, t in model.params.items() if t.type is not F32 or is_read_only(t)]
    if kept:
        raise StateError(f"{where}: the model maps its weights from the file ({kept[0]!r} is "
                         f"{model.params[kept[0]].type.name}, read-only); load it with "
                         f"base_type='f32' to set weights")
    expected = param_shapes(model.cfg)
    weights = dict(weights)  # each array made once (a mapping may compute them on access)
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


def is_read_only(t: Tensor) -> bool:
    """``t``'s memory is a read-only host array (a weight mapped from its file)."""
    data = buffer_of(t.data_owner()).data
    return isinstance(data, np.ndarray) and not data.flags.writeable
