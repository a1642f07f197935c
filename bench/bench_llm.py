"""The LLM example beside a PyTorch reference: same model, same init, same data order.

``python -m bench.bench_llm`` (from the repository root) trains the default model of
``python -m ggopt.examples.llm train``
with ggopt (dynamic graphs, as the example) and then the same model in PyTorch (eager,
``torch.optim.AdamW`` with ggml's hyper-parameters), feeding PyTorch exactly the windows, in
exactly the order, that ggopt's shuffles produced. It prints both validation-loss curves, their
relative difference, the step time and tokens/s of both, and where ggopt's dynamic-graph time
goes per micro-batch. ``--max-bytes`` shortens the corpus for a quick check.
Not part of the pytest run (no test functions).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

import ggopt
from ggopt.backend import Scheduler, cpu_init
from ggopt.examples import llm_data, llm_model, llm_train


def torch_forward(torch, cfg, w, tokens):
    """Logits (B, T, V) of the llama model; ``w`` maps llama.cpp names to torch tensors."""
    F = torch.nn.functional
    B, T = tokens.shape
    H, Hkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    theta = torch.arange(T, dtype=torch.float32)[:, None] * cfg.freq_base ** (
        -torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    cos, sin = torch.cos(theta)[None, :, None, :], torch.sin(theta)[None, :, None, :]

    def rope(x):  # (B, T, heads, hd), NORMAL mode: adjacent pairs
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)

    def norm(x, weight):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.eps) * weight

    mask = torch.triu(torch.full((T, T), float("-inf")), 1)
    x = w["token_embd.weight"][tokens]
    for i in range(cfg.n_layer):
        p = {k.split(".")[2]: v for k, v in w.items() if k.startswith(f"blk.{i}.")}
        h = norm(x, p["attn_norm"])
        q = rope((h @ p["attn_q"].T).view(B, T, H, hd)).transpose(1, 2)
        k = rope((h @ p["attn_k"].T).view(B, T, Hkv, hd)).transpose(1, 2)
        v = (h @ p["attn_v"].T).view(B, T, Hkv, hd).transpose(1, 2)
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, cfg.n_embd) @ p["attn_output"].T
        h = norm(x, p["ffn_norm"])
        x = x + (F.silu(h @ p["ffn_gate"].T) * (h @ p["ffn_up"].T)) @ p["ffn_down"].T
    return norm(x, w["output_norm.weight"]) @ w["output.weight"].T


def run_ggopt(cfg, tp, dataset, nepoch, seed):
    """Train with the example's Trainer; return val losses, the window order of each epoch,
    the seconds per optimizer step and the Timing."""
    model = llm_model.build_model(cfg, Scheduler([cpu_init()]))
    llm_model.set_weights(model, llm_model.init_weights(cfg, seed), "init")
    trainer = llm_train.Trainer(model, tp)
    ntrain, _ = trainer.split(dataset)
    val, orders = [], []
    for _ in range(nepoch):
        train_r, val_r = ggopt.opt.Result(), ggopt.opt.Result()
        trainer.epoch(dataset, train_r, val_r, silent=True)
        orders.append(dataset.permutation.copy())
        val.append(val_r.loss()[0])
    trainer.close()
    t = trainer.timing
    return val, orders, t.total / t.n * tp.opt_period, t


def run_torch(cfg, tp, dataset, orders, seed, threads):
    import torch

    torch.set_num_threads(threads)
    w = {k: torch.tensor(v, requires_grad=True)
         for k, v in llm_model.init_weights(cfg, seed).items()}
    opt = torch.optim.AdamW(w.values(), lr=tp.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=tp.wd)
    data = torch.tensor(dataset.data.numpy().astype(np.int64))
    labels = torch.tensor(dataset.labels.numpy().astype(np.int64))
    ub = tp.n_ubatch
    nub = dataset.ndata // ub
    ntrain = int(nub * (1 - tp.val_split))
    ntrain -= ntrain % tp.opt_period
    val, step_s = [], []

    def loss_of(idx):
        z = torch_forward(torch, cfg, w, data[idx])
        return torch.nn.functional.cross_entropy(z.reshape(-1, cfg.n_vocab),
                                                 labels[idx].reshape(-1))

    for order in orders:
        order = torch.tensor(order)
        t0 = time.perf_counter()
        for i in range(ntrain):
            loss = loss_of(order[i * ub:(i + 1) * ub]) / tp.opt_period
            loss.backward()
            if (i + 1) % tp.opt_period == 0:
                opt.step()
                opt.zero_grad()
        step_s.append((time.perf_counter() - t0) / (ntrain // tp.opt_period))
        with torch.no_grad():
            val.append(float(np.mean([loss_of(order[i * ub:(i + 1) * ub]).item()
                                      for i in range(ntrain, nub)])))
    return val, float(np.mean(step_s))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-bytes", type=int, default=0, help="truncate the corpus (0: all)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ggopt.set_n_threads(args.threads)
    cfg, tp = llm_model.Config(), llm_train.TrainParams()
    tokens = llm_data.tokenize(llm_data.read_corpus(llm_data.default_corpus_paths()))
    if args.max_bytes:
        tokens = tokens[:args.max_bytes]
    dataset = llm_data.make_dataset(tokens, cfg.n_ctx, cfg.n_ctx // 2)
    ntok_step = cfg.n_ctx * tp.n_batch
    print(f"{len(tokens)} bytes, {dataset.ndata} windows; {cfg}; {tp}; {args.threads} threads")

    val_g, orders, step_g, timing = run_ggopt(cfg, tp, dataset, args.epochs, args.seed)
    val_t, step_t = run_torch(cfg, tp, dataset, orders, args.seed, args.threads)
    for e, (a, b) in enumerate(zip(val_g, val_t), 1):
        print(f"epoch {e}: val loss ggopt {a:.5f}  torch {b:.5f}  rel diff {abs(a - b) / b:.2%}")
    print(f"step (n_batch={tp.n_batch}x{cfg.n_ctx} tokens): ggopt {1e3 * step_g:.1f} ms "
          f"({ntok_step / step_g:.0f} tok/s), torch {1e3 * step_t:.1f} ms "
          f"({ntok_step / step_t:.0f} tok/s), ratio ggopt/torch {step_g / step_t:.2f}")
    print(f"ggopt dynamic graphs per micro-batch: build + prepare_alloc + alloc "
          f"{1e3 * timing.build / timing.n:.2f} ms of {1e3 * timing.total / timing.n:.2f} ms "
          f"({100 * timing.build_share:.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
