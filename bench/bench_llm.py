"""``ggopt train`` beside a PyTorch reference: same model, same init, same data order.

``python -m bench.bench_llm`` (from the repository root) trains the default model of
``ggopt train`` with ggopt's FineTuner (dynamic graphs, as the command) and the same
model in PyTorch (eager, ``torch.optim.AdamW`` with ggml's hyper-parameters), feeding PyTorch
exactly the windows, in exactly the order, that ggopt's shuffles produced. The two alternate in
blocks of ``--block`` optimizer steps (ggopt's block, then PyTorch's same steps), so that a
change of load on a shared machine hits both sides alike. It prints both validation-loss
curves and their relative difference, the step time (median over blocks, and the mean) and
tokens/s of both. ``--val-every N``
also compares the validation losses every N steps (the curves). ``--max-bytes`` shortens the
corpus for a quick check. Not part of the pytest run (no test functions).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

try:  # before ggopt, so that PyTorch's OpenMP runtime sees a PyTorch user's environment
    import torch  # noqa: F401
except ImportError:
    pass

import ggopt  # noqa: E402
from ggopt.backend import Scheduler, cpu_init
from ggopt.cli import llm
from ggopt.lm import FinetuneParams, FineTuner, text_windows
from ggopt.models import llama


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


class TorchModel:
    """The PyTorch side: weights, AdamW, the dataset's windows as int64 tensors."""

    def __init__(self, cfg, fp, dataset, seed, threads):
        import torch

        torch.set_num_threads(threads)
        self.torch, self.cfg, self.fp = torch, cfg, fp
        self.w = {k: torch.tensor(v, requires_grad=True)
                  for k, v in llama.init_weights(cfg, seed).items()}
        self.opt = torch.optim.AdamW(self.w.values(), lr=fp.lr, betas=(0.9, 0.999), eps=1e-8,
                                     weight_decay=fp.wd)
        self.data = torch.tensor(dataset.data.numpy().astype(np.int64))
        self.labels = torch.tensor(dataset.labels.numpy().astype(np.int64))

    def loss(self, idx):
        z = torch_forward(self.torch, self.cfg, self.w, self.data[idx])
        return self.torch.nn.functional.cross_entropy(z.reshape(-1, self.cfg.n_vocab),
                                                      self.labels[idx].reshape(-1))

    def train(self, order, ub0, ub1):
        """Micro-batches ``ub0 .. ub1-1`` of ``order`` (whole optimizer steps)."""
        ub, period = self.fp.n_ubatch, self.fp.opt_period
        for i in range(ub0, ub1):
            (self.loss(order[i * ub:(i + 1) * ub]) / period).backward()
            if (i + 1) % period == 0:
                self.opt.step()
                self.opt.zero_grad()

    def validate(self, order, ub0, ub1):
        ub = self.fp.n_ubatch
        with self.torch.no_grad():
            return float(np.mean([self.loss(order[i * ub:(i + 1) * ub]).item()
                                  for i in range(ub0, ub1)]))


def validate_both(tuner, ref, order, ntrain, nval):
    """Both models' mean loss over the validation micro-batches (forward only: no state
    changes on either side)."""
    sums = [tuner.microbatch(ibatch, False, 1.0) for ibatch in range(ntrain, ntrain + nval)]
    loss = sum(s for s, _ in sums) / sum(n for _, n in sums)
    return loss, ref.validate(order, ntrain, ntrain + nval)


def run(cfg, fp, windows, nepoch, seed, threads, block, val_every=0):
    """Train both, alternating blocks of ``block`` optimizer steps; return the validation
    losses of both per epoch, the seconds per optimizer step of every block of both and the
    validation curve ``(step, ggopt, torch)`` every ``val_every`` steps (a multiple of
    ``block``; 0: none) and at each epoch's end."""
    model = llama.build_model(cfg, Scheduler([cpu_init()]))
    llama.set_weights(model, llama.init_weights(cfg, seed), "init")
    tuner = FineTuner(model, windows, fp)
    dataset = tuner.dataset
    ref = TorchModel(cfg, fp, dataset, seed, threads)
    ntrain, nval = tuner.n_train_mb, tuner.n_val_mb
    period = fp.opt_period
    weight = float(np.float32(1.0) / np.float32(period))  # FineTuner's, without masked labels
    val_g, val_t, step_g, step_t, curve = [], [], [], [], []
    done = 0
    for _ in range(nepoch):
        dataset.shuffle(tuner.opt_ctx, ntrain * fp.n_ubatch)  # as FineTuner.train_epoch
        order = ref.torch.tensor(dataset.permutation.copy())
        for s0 in range(0, ntrain // period, block):
            s1 = min(ntrain // period, s0 + block)
            t0 = time.perf_counter()
            for ibatch in range(s0 * period, s1 * period):
                tuner.microbatch(ibatch, True, weight)
            t1 = time.perf_counter()
            ref.train(order, s0 * period, s1 * period)
            t2 = time.perf_counter()
            step_g.append((t1 - t0) / (s1 - s0))
            step_t.append((t2 - t1) / (s1 - s0))
            done += s1 - s0
            if val_every and done % val_every == 0 and s1 < ntrain // period:
                curve.append((done, *validate_both(tuner, ref, order, ntrain, nval)))
        g, t = validate_both(tuner, ref, order, ntrain, nval)
        val_g.append(g)
        val_t.append(t)
        curve.append((done, g, t))
    tuner.close()
    return val_g, val_t, np.array(step_g), np.array(step_t), curve


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-bytes", type=int, default=0, help="truncate the corpus (0: all)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block", type=int, default=10,
                   help="optimizer steps per block: ggopt and PyTorch alternate by blocks")
    p.add_argument("--val-every", type=int, default=0,
                   help="also compare validation losses every N optimizer steps (a multiple "
                        "of --block; the time of these evaluations is outside the step times)")
    args = p.parse_args(argv)
    if args.val_every % max(1, args.block):
        p.error("--val-every must be a multiple of --block")
    ggopt.set_n_threads(args.threads)
    cfg = llama.Config()
    fp = FinetuneParams(n_batch=llm.BATCH, n_ubatch=llm.BATCH, lr=llm.LR, wd=llm.WD,
                        static=False)
    tokens = llm.read_corpus(llm.default_corpus_paths())
    if args.max_bytes:
        tokens = tokens[:args.max_bytes]
    windows = text_windows(list(tokens), cfg.n_ctx, cfg.n_ctx // 2)
    ntok_step = cfg.n_ctx * fp.n_batch
    print(f"{len(tokens)} bytes, {len(windows)} windows; {cfg}; {fp}; {args.threads} threads; "
          f"blocks of {args.block} steps")

    val_g, val_t, step_g, step_t, curve = run(
        cfg, fp, windows, args.epochs, args.seed, args.threads, max(1, args.block),
        max(0, args.val_every))
    if args.val_every:
        for step, a, b in curve:
            print(f"step {step:5d}: val loss ggopt {a:.5f}  torch {b:.5f}  "
                  f"rel diff {abs(a - b) / b:.2%}")
    for e, (a, b) in enumerate(zip(val_g, val_t), 1):
        print(f"epoch {e}: val loss ggopt {a:.5f}  torch {b:.5f}  rel diff {abs(a - b) / b:.2%}")
    g, t = float(np.median(step_g)), float(np.median(step_t))
    print(f"step (n_batch={fp.n_batch}x{cfg.n_ctx} tokens, median of {len(step_g)} blocks): "
          f"ggopt {1e3 * g:.1f} ms ({ntok_step / g:.0f} tok/s), torch {1e3 * t:.1f} ms "
          f"({ntok_step / t:.0f} tok/s), ratio ggopt/torch {g / t:.2f}; means "
          f"{1e3 * step_g.mean():.1f} / {1e3 * step_t.mean():.1f} ms "
          f"(ratio {step_g.mean() / step_t.mean():.2f}); ratio per block: min "
          f"{np.min(step_g / step_t):.2f}, median {np.median(step_g / step_t):.2f}, "
          f"max {np.max(step_g / step_t):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
