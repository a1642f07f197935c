"""Fine-tuning speed and memory: ggopt (full and LoRA) beside PyTorch eager on the same weights.

``python -m bench.bench_finetune [--steps 10] [--threads 2] [--rank 8]`` (repository root):
SmolLM2-135M-Instruct (the F32 copy of the cached Q4_1 file), windows of 256 tokens of
``/usr/share/common-licenses/GPL-3``, batch 1 x 256, AdamW lr 1e-5. Each configuration runs in
its own process (so that its peak RSS is its own): ``ggopt-full``, ``ggopt-lora``,
``torch-full``, ``torch-lora`` (a PyTorch llama written here, LoRA as ``W x + s B(A x)`` with
the base frozen, as PEFT computes it), ``hf-full``, ``hf-lora`` (``transformers``' own
LlamaForCausalLM and ``peft``'s LoRA on the same weights, ``bench/finetune_hf.py``; skipped
when those packages are absent), ``llamacpp-full`` (llama.cpp's own ``llama-finetune`` on
the F32 copy, given by ``--llama-finetune PATH`` or ``$LLAMA_FINETUNE``: a GPL-3 prefix of
exactly enough windows, its step times read from the timestamps it logs per step; skipped
without the binary), and on the Q4_1 file as shipped ``ggopt-lora-q4_1`` (LoRA on the
weights kept as stored, ``base_type="keep"``) beside ``llamacpp-q4_1`` (``llama-finetune``
on that file: it trains the norms only, repacking off), one after the other, ``--rounds``
times, each ``--warm`` + ``--steps`` training steps; it prints the median step time,
tokens/s, peak RSS and the ratios of one round. Not part of the pytest run.

``--families`` adds a row per model family at SmolLM2-135M's size (``ggopt-full-qwen2``,
``hf-full-qwen2``, ... for qwen2, qwen3, gemma3; ``--configs`` takes them too): SmolLM2's
dimensions, vocabulary and GPL-3 windows, each family's own parts (qwen2: q/k/v biases, NEOX
rope; qwen3: per-head q/k norms, key_length 64; gemma3: q/k norms, post norms, GELU FFN,
embeddings times sqrt(n_embd), a window of 128 tokens on five layers of six), seeded random
weights (:func:`family_config`), and ``transformers``' own ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``, ``Gemma3ForCausalLM`` on the same weights; the ratio per family is
printed beside SmolLM2's (llama's).

``--profile`` (ggopt's configurations) says where a step's time goes, from
:class:`ggopt.backend.profile.NodeTimes`: the weight products (the projections, forward and
backward), with LoRA the adapters' rank-``r`` products, attention (the per-head products and
softmax), the 49152-wide output product with its gradients and the cross-entropy, the
optimizer, everything else computed (norms, rope, SwiGLU, adds, copies, the embedding), and
what is not compute (building the forward and backward graphs, planning, setting the inputs);
and the products' GFLOP/s against a 2048^3 sgemm measured in the same process on the same
threads (ggopt's ``mul_mat`` and NumPy's BLAS on ``--threads`` threads, the faster of the two).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CONFIGS = ("ggopt-full", "ggopt-lora", "torch-full", "torch-lora", "hf-full", "hf-lora",
           "llamacpp-full", "ggopt-lora-q4_1", "llamacpp-q4_1")
#: PyTorch's low-precision rows (``--compute-type bf16`` compares against the fastest of each
#: kind): the model in bf16, fp32 weights under bf16 autocast (``bench/finetune_hf.py``)
HF_LOWP = ("hf-full-autocast", "hf-lora-bf16", "hf-lora-autocast")
#: the families with a row of their own (``--families``)
FAMILIES = ("qwen2", "qwen3", "gemma3")
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
GPL3 = "/usr/share/common-licenses/GPL-3"


def model_path(quantized: bool = False) -> Path:
    """The F32 copy (made once from the cached Q4_1 file), or with ``quantized`` that file."""
    from ggopt.models import llama

    cache = Path(os.environ.get("GGOPT_CACHE", Path.home() / ".cache" / "ggopt"))
    src, dst = cache / "SmolLM2-135M-Instruct.Q4_1.gguf", cache / "SmolLM2-135M-Instruct.F32.gguf"
    if not src.is_file():
        sys.exit(f"{src} missing (python tools/fetch_models.py smollm2)")
    if quantized:
        return src
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        llama.write_f32(src, dst)
    return dst


def family_config(cfg, arch: str):
    """SmolLM2-135M's config ``cfg`` (dimensions, vocabulary, tied output) as a model of the
    family ``arch``, with what that family adds (values of Qwen2.5/Qwen3/Gemma 3's small
    models: rope base 1e6, Gemma's local layers on 1e4, its eps 1e-6)."""
    import dataclasses

    if arch == "qwen2":
        return dataclasses.replace(cfg, arch=arch, qkv_bias=True, freq_base=1e6)
    if arch == "qwen3":
        return dataclasses.replace(cfg, arch=arch, n_embd_head=cfg.head_dim, freq_base=1e6)
    if arch == "gemma3":
        return dataclasses.replace(
            cfg, arch=arch, n_embd_head=cfg.head_dim, eps=1e-6, freq_base=1e6,
            freq_base_swa=1e4, n_swa=128, swa_layers=tuple(i % 6 < 5 for i in range(cfg.n_layer)),
            attn_scale=float(np.float32(1) / np.sqrt(np.float32(cfg.head_dim))))
    raise SystemExit(f"unknown family {arch!r} (one of {', '.join(FAMILIES)})")


def family_weights(cfg) -> dict[str, np.ndarray]:
    """Seeded random weights for ``cfg`` (GPT-2's scheme; the norms 1, biases small)."""
    from ggopt.models import llama

    w = llama.init_weights(cfg, seed=0)
    rng = np.random.default_rng(1)
    for name, arr in w.items():
        if name.endswith(".bias"):
            w[name] = (0.02 * rng.standard_normal(arr.shape)).astype(np.float32)
    return w


def split_config(config: str) -> tuple[str, str | None]:
    """``"hf-full-qwen2"`` -> ``("hf-full", "qwen2")``; SmolLM2's rows -> ``(config, None)``."""
    head, _, tail = config.rpartition("-")
    return (head, tail) if tail in FAMILIES else (config, None)


def gpl3_windows(model, n_ctx: int):
    """The windows of ``n_ctx`` tokens of GPL-3 every bench trains on."""
    from ggopt.lm.windows import text_windows, tokenize_texts

    return text_windows(tokenize_texts(model.require_tokenizer(), [Path(GPL3).read_text()]),
                        n_ctx)


CATEGORIES = ("weight products", "adapter products", "attention", "output + cross-entropy",
              "optimizer", "other compute", "graph building etc.")


def _category(nodes, n_vocab: int, rank: int) -> str:
    from ggopt.tensor import Op

    n = nodes[0]
    if n.op is Op.OPT_STEP_ADAMW:
        return "optimizer"
    if n.op in (Op.GET_ROWS, Op.GET_ROWS_BACK):
        return "other compute"
    shapes = [t.ne for t in (n, *n.src) if t is not None]
    if n.op in (Op.CROSS_ENTROPY_LOSS, Op.CROSS_ENTROPY_LOSS_BACK, Op.CROSS_ENTROPY_LOSS_IDS,
                Op.CROSS_ENTROPY_LOSS_IDS_BACK) or any(n_vocab in ne[:2] for ne in shapes):
        return "output + cross-entropy"
    if n.op in (Op.SOFT_MAX, Op.SOFT_MAX_BACK):
        return "attention"
    if n.op in (Op.MUL_MAT, Op.OUT_PROD):
        if any(ne[2] > 1 for ne in shapes):
            return "attention"
        return "adapter products" if rank and any(rank in ne[:2] for ne in shapes) else \
            "weight products"
    return "other compute"


def _flops(node) -> int:
    """2 x multiply-adds of a MUL_MAT or OUT_PROD node (0 for any other)."""
    from ggopt.tensor import Op

    if node.op is Op.MUL_MAT:
        return 2 * node.src[0].ne[0] * node.nelements()
    if node.op is Op.OUT_PROD:
        return 2 * node.src[0].ne[1] * node.nelements()
    return 0


def sgemm_peak(threads: int, n: int = 2048, reps: int = 5) -> dict[str, float]:
    """GFLOP/s of an n^3 F32 product: ggopt's mul_mat (one-thread sgemm pieces over the
    kernels' threads) and NumPy's BLAS on ``threads`` threads; best of ``reps``."""
    import threadpoolctl

    import ggopt
    from ggopt import backend as gb

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    ctx = ggopt.Context()
    ta, tb = ctx.new_tensor_2d(ggopt.F32, n, n), ctx.new_tensor_2d(ggopt.F32, n, n)
    sched = gb.Scheduler([gb.cpu_init()])
    gb.alloc_ctx_tensors(ctx, sched.backends[0])
    gb.tensor_set(ta, a)
    gb.tensor_set(tb, b)
    c2 = ggopt.Context()
    out = ggopt.mul_mat(c2, ta, tb)
    g = ggopt.new_graph(c2)
    ggopt.build_forward_expand(g, out)
    sched.alloc_graph(g)
    best = {"ggopt": math.inf, "numpy": math.inf}
    with threadpoolctl.threadpool_limits(threads, user_api="blas"):
        for _ in range(reps):
            t0 = time.perf_counter()
            sched.graph_compute(g)
            best["ggopt"] = min(best["ggopt"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            a @ b
            best["numpy"] = min(best["numpy"], time.perf_counter() - t0)
    out = {k: 2 * n ** 3 / v / 1e9 for k, v in best.items()}
    out.update(_torch_peak(threads, reps))
    return out


def _torch_peak(threads: int, reps: int) -> dict[str, float]:
    """PyTorch's (MKL's own threaded sgemm: the references' BLAS) GFLOP/s on the step's most
    frequent product, 1536 x 576 by 256 tokens, on ``threads`` threads; {} without PyTorch."""
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(threads)
    w, x = torch.randn(1536, 576), torch.randn(256, 576)
    best = math.inf
    for _ in range(reps * 10):
        t0 = time.perf_counter()
        x @ w.T
        best = min(best, time.perf_counter() - t0)
    return {"torch": 2 * 1536 * 576 * 256 / best / 1e9}


def run_ggopt(lora_rank: int, steps: int, n_ctx: int, warm: int = 0,
              profile: dict | None = None, static: bool = True,
              quantized: bool = False, compute_type: str = "f32",
              arch: str | None = None) -> list[float]:
    """Step times; with ``profile`` (a dict), also fills it with the seconds per category
    over the steps after ``warm`` and the weight products' flops; with ``arch``, a model of
    that family at SmolLM2's size (:func:`family_config`)."""
    from ggopt.backend.profile import NodeTimes
    from ggopt.lm import lora
    from ggopt.lm.finetune import FinetuneParams, FineTuner
    from ggopt.models import llama
    from ggopt.models.llama.compute import load_compute_type

    model = llama.load(model_path(quantized), progress=False,
                       base_type="keep" if quantized else "f32",
                       compute_type=load_compute_type(compute_type, not lora_rank))
    windows, net, n_vocab = gpl3_windows(model, n_ctx), model.net, model.cfg.n_vocab
    if arch is not None:
        import ggopt.backend as gb

        cfg = family_config(model.cfg, arch)
        model = net = None  # free SmolLM2's weights
        net = llama.build_model(cfg, gb.Scheduler([gb.cpu_init()]))
        llama.set_weights(net, family_weights(cfg), "bench")
    if lora_rank:
        lora.attach(net, lora.create(net, lora_rank, 2.0 * lora_rank))
    ft = FineTuner(net, windows,
                   FinetuneParams(lr=1e-5, val_split=0.0, static=static,
                                  compute_type=compute_type))
    times = []
    rec = NodeTimes()
    with rec if profile is not None else contextlib.nullcontext():
        for i in range(steps):
            if i == warm:
                rec.clear()
            t0 = time.perf_counter()
            ft.microbatch(i % ft.n_train_mb, True, 1.0)
            times.append(time.perf_counter() - t0)
    ft.close()
    if profile is not None:
        secs = dict.fromkeys(CATEGORIES, 0.0)
        flops = 0
        for st in rec.steps:
            cat = _category(st.nodes, n_vocab, lora_rank)
            secs[cat] += st.seconds
            if cat.endswith("products"):
                flops += _flops(st.nodes[0]) * st.calls
        secs["graph building etc."] = sum(times[warm:]) - rec.total()
        profile.update(seconds=secs, product_flops=flops)
    return times


def torch_logits(torch, cfg, w, tokens, proj):
    """Logits (B, T, V); ``proj(name, W, x)`` computes a block's projection."""
    F = torch.nn.functional
    B, T = tokens.shape
    H, Hkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    theta = torch.arange(T, dtype=torch.float32)[:, None] * cfg.freq_base ** (
        -torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    cos, sin = torch.cos(theta)[None, :, None, :], torch.sin(theta)[None, :, None, :]

    def rope(x):
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)

    def norm(x, weight):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.eps) * weight

    x = w["token_embd.weight"][tokens]
    for i in range(cfg.n_layer):
        b = f"blk.{i}."

        def mm(name, h, b=b):
            return proj(b + name + ".weight", w[b + name + ".weight"], h)

        h = norm(x, w[b + "attn_norm.weight"])
        q = rope(mm("attn_q", h).view(B, T, H, hd)).transpose(1, 2)
        k = rope(mm("attn_k", h).view(B, T, Hkv, hd)).transpose(1, 2)
        v = mm("attn_v", h).view(B, T, Hkv, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + mm("attn_output", att.transpose(1, 2).reshape(B, T, cfg.n_embd))
        h = norm(x, w[b + "ffn_norm.weight"])
        x = x + mm("ffn_down", F.silu(mm("ffn_gate", h)) * mm("ffn_up", h))
    return norm(x, w["output_norm.weight"]) @ w["token_embd.weight"].T


def run_torch(lora_rank: int, steps: int, n_ctx: int, threads: int) -> list[float]:
    import torch

    from ggopt.models import llama

    torch.set_num_threads(threads)
    model = llama.load(model_path(), progress=False)
    windows = gpl3_windows(model, n_ctx)
    cfg = model.cfg
    w = {k: torch.tensor(v, requires_grad=not lora_rank)
         for k, v in llama.get_weights(model.net).items()}
    model = None  # free ggopt's copy
    ab = {}
    if lora_rank:
        s = 2.0
        for name, t in w.items():
            if name.split(".")[-2] in TARGETS:
                n_out, n_in = t.shape
                a = torch.empty(lora_rank, n_in).uniform_(-1 / math.sqrt(n_in), 1 / math.sqrt(n_in))
                ab[name] = (a.requires_grad_(), torch.zeros(n_out, lora_rank, requires_grad=True))

        def proj(name, W, x):
            y = x @ W.T
            if name in ab:
                a, b = ab[name]
                y = y + s * ((x @ a.T) @ b.T)
            return y
        params = [p for pair in ab.values() for p in pair]
    else:
        def proj(name, W, x):
            return x @ W.T
        params = list(w.values())
    from bench.finetune_hf import time_adamw_steps

    return time_adamw_steps(torch, params, lambda tok: torch_logits(torch, cfg, w, tok, proj),
                            windows, steps)


def run_hf_config(lora_rank: int, steps: int, n_ctx: int, threads: int,
                  mode: str = "fp32", arch: str | None = None) -> list[float]:
    from bench.finetune_hf import run_hf
    from ggopt.models import llama

    model = llama.load(model_path(), progress=False)
    windows, cfg, weights = gpl3_windows(model, n_ctx), model.cfg, llama.get_weights(model.net)
    model = None  # free ggopt's copy
    if arch is not None:
        cfg = family_config(cfg, arch)
        weights = family_weights(cfg)
    return run_hf(lora_rank, steps, windows, cfg, weights, threads, mode)


def run_llama_finetune(binary: str, steps: int, n_ctx: int, threads: int,
                       quantized: bool = False) -> list[float]:
    """Step times of llama.cpp's ``llama-finetune`` (one epoch, val split 5 %) over a GPL-3
    prefix holding just over ``steps`` training windows; on the F32 copy, or with
    ``quantized`` on the Q4_1 file (repacking off: its AMX path faults on this CPU)."""
    import re
    import tempfile

    from ggopt.lm.windows import tokenize_texts
    from ggopt.models import llama

    model = llama.load(model_path(), progress=False)
    tok, text = model.require_tokenizer(), Path(GPL3).read_text()
    model = None
    n_windows = math.ceil((steps + 1) / 0.95) + 1  # steps + 1 stamped starts after the split
    need = n_windows * (n_ctx // 2) + n_ctx + 1
    lo, hi = 1, len(text)
    while lo < hi:  # the shortest prefix with `need` tokens
        mid = (lo + hi) // 2
        if len(tokenize_texts(tok, [text[:mid]])) >= need:
            hi = mid
        else:
            lo = mid + 1
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "text.txt").write_text(text[:lo])
        proc = subprocess.run(
            [binary, "-m", str(model_path(quantized)), *(["-nr"] if quantized else []),
             "-f", "text.txt", "-c", str(n_ctx), "-b",
             str(n_ctx), "-ub", str(n_ctx), "-t", str(threads), "-epochs", "1", "-lr", "1e-5",
             "-o", "out.gguf"], cwd=tmp, capture_output=True, text=True, check=True)
    # one "epoch 0 lr=..." line per training step, stamped m.ss.mmm.uuu since the start
    stamps = [int(m) * 60 + int(s) + int(ms) / 1e3 + int(us) / 1e6 for m, s, ms, us in
              re.findall(r"(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) I epoch 0 lr=", proc.stderr)]
    return [b - a for a, b in zip(stamps, stamps[1:])][:steps]


def child(config: str, steps: int, n_ctx: int, threads: int, rank: int, warm: int,
          profile: bool, static: bool, llama_finetune: str | None = None,
          compute_type: str = "f32") -> None:
    import ggopt

    ggopt.set_n_threads(threads)
    r = rank if "lora" in config else 0
    name, arch = split_config(config)
    if config.startswith("llamacpp"):
        times = run_llama_finetune(str(llama_finetune), steps, n_ctx, threads,
                                   config.endswith("q4_1"))
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps({"config": config, "times": times, "peak_mb": peak}))
        return
    prof: dict | None = {} if profile and config.startswith("ggopt") else None
    if config.startswith("ggopt"):
        times = run_ggopt(r, steps, n_ctx, warm, prof, static, config.endswith("q4_1"),
                          compute_type, arch)
    elif config.startswith("hf"):
        mode = name.split("-")[2] if name.count("-") == 2 else "fp32"
        times = run_hf_config(r, steps, n_ctx, threads, mode, arch)
    else:
        times = run_torch(r, steps, n_ctx, threads)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rec = {"config": config, "times": times, "peak_mb": peak}
    if prof is not None:
        rec.update(prof, peak_gflops=sgemm_peak(threads))
    print(json.dumps(rec))


def print_profile(rec: dict, warm: int) -> None:
    n = len(rec["times"]) - warm
    step = sum(rec["times"][warm:]) / n
    secs = rec["seconds"]
    print(f"  {rec['config']}: mean step {step:.3f} s over {n} steps")
    for cat in CATEGORIES:
        print(f"    {cat:24s} {secs[cat] / n:7.3f} s  {100 * secs[cat] / n / step:5.1f} %")
    gf = rec["product_flops"] / (secs["weight products"] + secs["adapter products"]) / 1e9
    peak = rec["peak_gflops"]
    top = max(peak.values())
    print(f"    weight and adapter products: {rec['product_flops'] / n / 1e9:.1f} GFLOP per step "
          f"at {gf:.1f} GFLOP/s = {100 * gf / top:.0f} % of the best sgemm measured here, "
          f"{top:.1f} GFLOP/s (2048^3: ggopt mul_mat {peak['ggopt']:.1f}, NumPy BLAS "
          f"{peak['numpy']:.1f}"
          + (f", PyTorch on 1536x576x256 {peak['torch']:.1f}" if "torch" in peak else "")
          + ")")


def _have_hf() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "peft"))


def bench_parser(description: str | None, configs: tuple[str, ...]) -> argparse.ArgumentParser:
    """The options the fine-tune benches share (steps, rounds, threads, LoRA rank, context,
    configurations, and the hidden ``--child`` each configuration's process gets)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--configs", default=",".join(configs))
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, CONFIGS)
    p.add_argument("--profile", action="store_true",
                   help="where ggopt's step time goes (see the module docstring)")
    p.add_argument("--dynamic", action="store_true",
                   help="ggopt on a fresh graph per step, as llama-finetune (default: one "
                        "static graph, the same bits)")
    p.add_argument("--llama-finetune", default=os.environ.get("LLAMA_FINETUNE"),
                   help="llama.cpp's llama-finetune binary (default $LLAMA_FINETUNE)")
    p.add_argument("--compute-type", choices=("f32", "bf16"), default="f32",
                   help="ggopt's products (docs/compute-type.md); the hf-* rows of "
                        f"{', '.join(HF_LOWP)} are PyTorch's bf16 counterparts")
    p.add_argument("--families", action="store_true",
                   help="also a row per family (qwen2, qwen3, gemma3) at SmolLM2's size for "
                        "each ggopt-*/hf-* configuration (full, lora) given")
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.warm + args.steps, args.ctx, args.threads, args.rank, args.warm,
              args.profile, not args.dynamic, args.llama_finetune, args.compute_type)
        return 0
    model_path()
    results: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    print(f"load: {os.getloadavg()}")
    configs = args.configs.split(",")
    if args.families:
        configs += [f"{c}-{arch}" for arch in FAMILIES for c in list(configs)
                    if c in ("ggopt-full", "ggopt-lora", "hf-full", "hf-lora")]
    if any(c.startswith("hf") for c in configs) and not _have_hf():
        print("hf-*: skipped (pip install -e '.[hf-bench]' to time them)")
        configs = [c for c in configs if not c.startswith("hf")]
    if not (args.llama_finetune and Path(args.llama_finetune).is_file()) and any(
            c.startswith("llamacpp") for c in configs):
        print("llamacpp-*: skipped (give --llama-finetune PATH to time them)")
        configs = [c for c in configs if not c.startswith("llamacpp")]
    for _ in range(args.rounds):
        for config in configs:
            cmd = [sys.executable, "-m", "bench.bench_finetune", "--child", config,
                   "--steps", str(args.steps), "--warm", str(args.warm), "--threads",
                   str(args.threads), "--rank", str(args.rank), "--ctx", str(args.ctx),
                   *(["--profile"] if args.profile else []),
                   *(["--dynamic"] if args.dynamic else []),
                   *(["--llama-finetune", args.llama_finetune] if args.llama_finetune else []),
                   "--compute-type", args.compute_type]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rec = json.loads(out.strip().splitlines()[-1])
            results.setdefault(config, []).extend(rec["times"][args.warm:])
            peaks[config] = max(peaks.get(config, 0.0), rec["peak_mb"])
            med = statistics.median(rec["times"][args.warm:])
            print(f"{config}: median step {med:.3f} s, min {min(rec['times'][args.warm:]):.3f} s,"
                  f" {args.ctx / med:.1f} tokens/s, peak RSS {rec['peak_mb']:.0f} MB", flush=True)
            if "seconds" in rec:
                print_profile(rec, args.warm)
    print(f"load: {os.getloadavg()}")
    med = {c: statistics.median(t) for c, t in results.items()}
    q, lq = med.get("ggopt-lora-q4_1"), med.get("llamacpp-q4_1")
    if q and lq:
        print(f"Q4_1 file: ggopt LoRA {args.ctx / q:.1f} vs llama-finetune (norms only) "
              f"{args.ctx / lq:.1f} tokens/s (x{lq / q:.2f}); peak RSS "
              f"{peaks['ggopt-lora-q4_1']:.0f} vs {peaks['llamacpp-q4_1']:.0f} MB")
    if q and med.get("ggopt-lora"):
        print(f"Q4_1 kept vs F32 LoRA: x{med['ggopt-lora'] / q:.2f} the tokens/s, peak RSS "
              f"x{peaks['ggopt-lora-q4_1'] / peaks['ggopt-lora']:.3f}")
    for kind in ("full", "lora"):
        g = med.get(f"ggopt-{kind}")
        for ref, label in (("torch", "PyTorch"), ("hf", "transformers+peft"),
                           ("llamacpp", "llama-finetune")):
            t = med.get(f"{ref}-{kind}")
            if g and t:
                print(f"{kind}: ggopt {args.ctx / g:.1f} vs {label} {args.ctx / t:.1f} tokens/s "
                      f"(x{t / g:.2f}); peak RSS {peaks[f'ggopt-{kind}']:.0f} vs "
                      f"{peaks[f'{ref}-{kind}']:.0f} MB")
        for arch in FAMILIES:
            ga, ha = med.get(f"ggopt-{kind}-{arch}"), med.get(f"hf-{kind}-{arch}")
            t = med.get(f"hf-{kind}")
            if ga and ha:
                line = (f"{kind} {arch}: ggopt {args.ctx / ga:.1f} vs transformers "
                        f"{args.ctx / ha:.1f} tokens/s (x{ha / ga:.2f})")
                if g and t:
                    line += (f"; SmolLM2 (llama) x{t / g:.2f}: the family's ratio is "
                             f"{(ha / ga) / (t / g):.3f} of llama's")
                print(line + f"; peak RSS {peaks[f'ggopt-{kind}-{arch}']:.0f} vs "
                      f"{peaks[f'hf-{kind}-{arch}']:.0f} MB")
        hf = {c: med[c] for c in (f"hf-{kind}", *HF_LOWP) if c in med and f"-{kind}" in c}
        if g and hf:
            best = min(hf, key=hf.__getitem__)
            print(f"{kind} ({args.compute_type}): ggopt {args.ctx / g:.1f} vs the fastest "
                  f"PyTorch row {best} {args.ctx / hf[best]:.1f} tokens/s (x{hf[best] / g:.2f}); "
                  f"peak RSS {peaks[f'ggopt-{kind}']:.0f} vs {peaks[best]:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
