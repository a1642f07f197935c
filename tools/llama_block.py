"""One llama decoder block with an embedding and an output head, built twice: as a ggopt graph
by the library's llama graph builder (the way llama.cpp builds it), and in PyTorch (float64,
rope written from ggml's formula). Used by tests/cli/test_llama_block.py and
bench/bench_transformer.py (so it lives in tools/, which both may import).

Weights are NumPy arrays in NumPy order: a ggml weight ``ne = [in, out]`` is ``(out, in)``,
applied as ``y = x @ W.T`` in PyTorch and as ``mul_mat(W, x)`` in ggml.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import ggopt
from ggopt import backend as gb
from ggopt.models import llama

WEIGHTS = ("tok_embd", "attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up",
           "w_down", "out_norm", "output")


@dataclasses.dataclass(frozen=True)
class Config:
    n_vocab: int = 20
    n_embd: int = 32
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 48
    n_tokens: int = 9
    eps: float = 1e-5
    freq_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def init_weights(cfg: Config, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    C, F, V, Ckv = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.head_dim * cfg.n_head_kv
    shapes = {"tok_embd": (V, C), "wq": (C, C), "wk": (Ckv, C), "wv": (Ckv, C), "wo": (C, C),
              "w_gate": (F, C), "w_up": (F, C), "w_down": (C, F), "output": (V, C)}
    w = {k: (rng.standard_normal(s) / math.sqrt(s[1])).astype(np.float32)
         for k, s in shapes.items()}
    w["tok_embd"] = rng.standard_normal((V, C)).astype(np.float32)
    for k in ("attn_norm", "ffn_norm", "out_norm"):
        w[k] = (1 + 0.2 * rng.standard_normal(C)).astype(np.float32)
    return w


def causal_mask(n: int) -> np.ndarray:
    return np.triu(np.full((n, n), -np.inf, np.float32), 1)


#: The block's weight names as llama.cpp's tensor names (one layer).
LLAMA_NAMES = {"tok_embd": "token_embd.weight", "attn_norm": "blk.0.attn_norm.weight",
               "wq": "blk.0.attn_q.weight", "wk": "blk.0.attn_k.weight",
               "wv": "blk.0.attn_v.weight", "wo": "blk.0.attn_output.weight",
               "ffn_norm": "blk.0.ffn_norm.weight", "w_gate": "blk.0.ffn_gate.weight",
               "w_up": "blk.0.ffn_up.weight", "w_down": "blk.0.ffn_down.weight",
               "out_norm": "output_norm.weight", "output": "output.weight"}


def build_block(cctx: ggopt.Context, cfg: Config, p: dict[str, ggopt.Tensor],
                tokens: ggopt.Tensor, pos: ggopt.Tensor, mask: ggopt.Tensor,
                sched: gb.Scheduler) -> ggopt.Tensor:
    """The logits ``[n_vocab, n_tokens]`` of the block: ggopt's llama graph
    (:func:`ggopt.models.llama.build_graph`) with one layer."""
    lcfg = llama.Config(n_ctx=cfg.n_tokens, n_embd=cfg.n_embd, n_layer=1, n_head=cfg.n_head,
                        n_head_kv=cfg.n_head_kv, n_ff=cfg.n_ff, n_vocab=cfg.n_vocab,
                        eps=cfg.eps, freq_base=cfg.freq_base)
    params = {LLAMA_NAMES[k]: t for k, t in p.items()}
    model = llama.LlamaModel(lcfg, sched, cctx, params)
    inp = llama.Inputs(cctx, tokens, pos, mask, 1, cfg.n_tokens)
    return llama.build_graph(cctx, model, inp).logits


class GgoptBlock:
    """The block with a cross-entropy loss, parameters, gradients, allocated on the CPU."""

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray], tokens: np.ndarray,
                 labels: np.ndarray) -> None:
        self.cfg = cfg
        ctx = ggopt.Context()
        self.params = {k: ctx.new_tensor(ggopt.F32, tuple(reversed(weights[k].shape)))
                       for k in WEIGHTS}
        for k, t in self.params.items():
            ggopt.set_param(t)
            ggopt.set_name(t, k)
        T = cfg.n_tokens
        tok, pos = ctx.new_tensor_1d(ggopt.I32, T), ctx.new_tensor_1d(ggopt.I32, T)
        mask = ctx.new_tensor_2d(ggopt.F32, T, T)
        onehot = ctx.new_tensor_2d(ggopt.F32, cfg.n_vocab, T)
        for t in (tok, pos, mask, onehot):
            ggopt.set_input(t)
        cpu = gb.cpu_init()
        self.sched = gb.Scheduler([cpu])
        cctx = ggopt.Context()
        logits = build_block(cctx, cfg, self.params, tok, pos, mask, self.sched)
        self.loss = ggopt.cross_entropy_loss(cctx, logits, onehot)
        ggopt.set_output(self.loss)
        ggopt.set_loss(self.loss)
        gf = ggopt.new_graph_custom(cctx, 4096, True)
        ggopt.build_forward_expand(gf, self.loss)
        self.gb = ggopt.graph_dup(cctx, gf)
        ggopt.build_backward_expand(cctx, self.gb, None)
        self.grads = {k: ggopt.graph_get_grad(self.gb, t) for k, t in self.params.items()}
        for t in self.grads.values():
            ggopt.set_output(t)
        gb.alloc_ctx_tensors(ctx, cpu)
        for k, t in self.params.items():
            gb.tensor_set(t, weights[k])
        gb.tensor_set(tok, tokens.astype(np.int32))
        gb.tensor_set(pos, np.arange(T, dtype=np.int32))
        gb.tensor_set(mask, causal_mask(T))
        gb.tensor_set(onehot, np.eye(cfg.n_vocab, dtype=np.float32)[labels])
        self.sched.alloc_graph(self.gb)

    def step(self) -> None:
        """One forward and backward pass."""
        ggopt.graph_reset(self.gb)
        self.sched.graph_compute(self.gb)

    def loss_and_grads(self) -> tuple[float, dict[str, np.ndarray]]:
        self.step()
        grads = {k: gb.tensor_get(t).reshape(self.params[k].shape)
                 for k, t in self.grads.items()}
        return self.loss.numpy().item(), grads


def torch_rope(x, pos, base: float):
    """ggml's NORMAL rope of ``x`` (T, heads, hd): adjacent pairs turn by p*base^(-2i/hd)."""
    import torch

    hd = x.shape[-1]
    theta = pos[:, None].to(x.dtype) * base ** (-torch.arange(0, hd, 2, dtype=x.dtype) / hd)
    cos, sin = torch.cos(theta)[:, None, :], torch.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def torch_block_loss(cfg: Config, w: dict, tokens, labels):
    """The same model in PyTorch; ``w`` maps names to tensors (requires_grad as wanted)."""
    import torch
    import torch.nn.functional as F

    T, hd, H, Hkv = cfg.n_tokens, cfg.head_dim, cfg.n_head, cfg.n_head_kv

    def norm(x, weight):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.eps) * weight

    pos = torch.arange(T)
    x = w["tok_embd"][tokens]                                      # (T, C)
    h = norm(x, w["attn_norm"])
    q = torch_rope((h @ w["wq"].T).view(T, H, hd), pos, cfg.freq_base).transpose(0, 1)
    k = torch_rope((h @ w["wk"].T).view(T, Hkv, hd), pos, cfg.freq_base).transpose(0, 1)
    v = (h @ w["wv"].T).view(T, Hkv, hd).transpose(0, 1)
    k = k.repeat_interleave(H // Hkv, dim=0)                       # head h uses KV h // group
    v = v.repeat_interleave(H // Hkv, dim=0)
    mask = torch.triu(torch.full((T, T), float("-inf"), dtype=x.dtype), 1)
    att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + mask, dim=-1)
    x = x + (att @ v).transpose(0, 1).reshape(T, cfg.n_embd) @ w["wo"].T
    h = norm(x, w["ffn_norm"])
    x = x + (F.silu(h @ w["w_gate"].T) * (h @ w["w_up"].T)) @ w["w_down"].T
    logits = norm(x, w["out_norm"]) @ w["output"].T
    return F.cross_entropy(logits, labels)
