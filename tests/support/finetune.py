"""Tiny random llamas and their loss gradients for the fine-tune tests."""

from __future__ import annotations

import numpy as np

import ggopt
from ggopt import backend as gb
from ggopt.lm.finetune import _LossInputs
from ggopt.lm.windows import MASKED, Windows
from ggopt.models import llama

CFG = llama.Config(n_ctx=16, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48, n_vocab=64,
                   tied_output=True)


def tiny(cfg: llama.Config = CFG, seed: int = 1) -> llama.LlamaModel:
    net = llama.build_model(cfg, gb.Scheduler([gb.cpu_init()]))
    w = llama.init_weights(cfg, seed)
    # larger weights than GPT-2's init, so that the gradients are far from zero
    w = {k: (v * 5 if v.ndim == 2 else v) for k, v in w.items()}
    llama.set_weights(net, w, "tiny")
    return net


def windows(n: int, n_ctx: int = 16, n_vocab: int = 64, seed: int = 0,
            masked: bool = False) -> Windows:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, n_vocab, (n, n_ctx)).astype(np.int32)
    labels = rng.integers(0, n_vocab, (n, n_ctx)).astype(np.int32)
    if masked:
        labels[rng.random((n, n_ctx)) < 0.4] = MASKED
        labels[:, 0] = rng.integers(0, n_vocab, n)  # every window trains something
    return Windows(tokens, labels)


class OneHotLoss:
    """The fine-tune loss from ggml's own ops, as ggopt built it before the cross-entropy on
    ids: ``w * cross_entropy_loss(logits * m, one_hot)`` (``m`` 0 at masked positions, whose
    one-hot rows are all zero), with ``_LossInputs``' interface."""

    def __init__(self, net: llama.LlamaModel, n_rows: int) -> None:
        self.ctx, V = ggopt.Context(), net.cfg.n_vocab
        self.labels = self.ctx.new_tensor_2d(ggopt.F32, V, n_rows)
        self.mask = self.ctx.new_tensor_2d(ggopt.F32, 1, n_rows)
        self.weight = self.ctx.new_tensor_1d(ggopt.F32, 1)
        gb.alloc_ctx_tensors(self.ctx, net.sched.get_backend(0))
        self.shape = (n_rows, V)

    def loss(self, ctx: ggopt.Context, logits: ggopt.Tensor) -> ggopt.Tensor:
        ce = ggopt.cross_entropy_loss(ctx, ggopt.mul(ctx, logits, self.mask), self.labels)
        return ggopt.mul(ctx, ce, self.weight)

    def set(self, labels: np.ndarray, weight: float) -> None:
        flat = labels.reshape(-1)
        keep = np.flatnonzero(flat != MASKED)
        one_hot = np.zeros(self.shape, np.float32)
        one_hot[keep, flat[keep]] = 1.0
        gb.tensor_set(self.labels, one_hot)
        gb.tensor_set(self.mask, (flat != MASKED).astype(np.float32))
        gb.tensor_set(self.weight, np.array([weight], np.float32))


def loss_and_grads(net: llama.LlamaModel, tokens: np.ndarray, labels: np.ndarray,
                   weight: float = 1.0, one_hot: bool = False,
                   segments: np.ndarray | None = None
                   ) -> tuple[float, dict[str, np.ndarray]]:
    """The fine-tune loss of one micro-batch and the gradient of every PARAM by name
    (``one_hot``: through :class:`OneHotLoss` instead of the fine-tune's own loss;
    ``segments``: packed windows, :func:`llama.set_segments`)."""
    B, T = tokens.shape
    inp = llama.make_inputs(net, B, T, packed=segments is not None)
    loss_in = OneHotLoss(net, B * T) if one_hot else _LossInputs(net, B * T)
    cctx = ggopt.Context()
    loss = loss_in.loss(cctx, llama.build_logits(cctx, net, inp, output=False))
    ggopt.set_output(loss)
    ggopt.set_loss(loss)
    gf = ggopt.new_graph_custom(cctx, 16384, True)
    ggopt.build_forward_expand(gf, loss)
    g = ggopt.graph_dup(cctx, gf)
    ggopt.build_backward_expand(cctx, g, None)
    params = [n for n in g.nodes if n.is_param] + [n for n in g.leafs if n.is_param]
    grads = {}
    for p in params:
        gt = ggopt.graph_get_grad(g, p)
        if gt is not None:
            ggopt.set_output(gt)
            grads[p.name] = (p, gt)
    gb.tensor_set(inp.tokens, tokens.reshape(-1).astype(np.int32))
    if segments is not None:
        llama.set_segments(inp, net.cfg, segments)
    loss_in.set(labels, weight)
    net.sched.reset()
    net.sched.alloc_graph(g)
    ggopt.graph_reset(g)
    net.sched.graph_compute(g)
    out = {name: gb.tensor_get(gt).reshape(p.ne[1], p.ne[0]) if p.ne[1] > 1 else
           gb.tensor_get(gt).reshape(-1) for name, (p, gt) in grads.items()}
    return float(gb.tensor_get(loss).reshape(-1)[0]), out


def logits(net: llama.LlamaModel, tokens: np.ndarray) -> np.ndarray:
    """The model's logits for one sequence of ``tokens`` (a forward graph on its scheduler)."""
    inp = llama.make_inputs(net, 1, len(tokens))
    ctx = ggopt.Context()
    out = llama.build_logits(ctx, net, inp)
    gf = ggopt.new_graph_custom(ctx, 16384, False)
    ggopt.build_forward_expand(gf, out)
    net.sched.reset()
    net.sched.alloc_graph(gf)
    gb.tensor_set(inp.tokens, tokens.astype(np.int32))
    net.sched.graph_compute(gf)
    return gb.tensor_get(out).copy()
