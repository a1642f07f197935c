"""LoRA on the quantized file as shipped against LoRA on its F32 dequantization.

``python -m bench.bench_lora_quant [--steps 10] [--warm 2] [--rounds 1] [--threads 2]``
(repository root): SmolLM2-135M-Instruct Q4_1 (the cached file) loaded with
``base_type="keep"`` (Q4_1/Q8_0 mapped, frozen) and ``"f32"`` (dequantized), LoRA r=8
alpha 16 on all seven projections, windows of 256 tokens of GPL-3, batch 1 x 256, AdamW
lr 1e-4. Each configuration runs in its own process (its peak RSS is its own), the two
alternating ``--rounds`` times; each prints its held-out loss before and after its steps,
the median step time, tokens/s, :func:`ggopt.lm.memory.memory_report` and the peak RSS, and
the end the keep/f32 ratios. Not part of the pytest run.

``--process``: the whole ``ggopt finetune`` process as a user runs it instead (load, the
held-out loss before, one epoch over GPL-3, validation, the merged model and the adapter
written; ``--lora RANK --base-type keep|f32 --ctx --threads``): each run's peak RSS from
``wait4`` (that child's alone), its tokens/s as it prints them, and the keep/f32 ratios.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench.bench_finetune import GPL3, bench_parser, gpl3_windows, model_path

CONFIGS = ("f32", "keep")


def child(base_type: str, steps: int, n_ctx: int, threads: int, rank: int) -> dict[str, object]:
    import ggopt
    from ggopt.lm import lora
    from ggopt.lm.finetune import FinetuneParams, FineTuner
    from ggopt.lm.memory import memory_report
    from ggopt.models import llama

    ggopt.set_n_threads(threads)
    model = llama.load(model_path(quantized=True), progress=False, base_type=base_type)
    windows = gpl3_windows(model, n_ctx)
    adapter = lora.create(model.net, rank, 2.0 * rank, seed=0)
    lora.attach(model.net, adapter)
    ft = FineTuner(model.net, windows, FinetuneParams(lr=1e-4, val_split=0.05))
    before = ft.validate()
    times, cpu = [], []
    for i in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        ft.microbatch(i % ft.n_train_mb, True, 1.0)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    after = ft.validate()
    mem = memory_report(ft)
    ft.close()
    return {"config": base_type, "times": times, "cpu": cpu, "val_before": before.loss,
            "val_after": after.loss, "memory": mem.lines(), "peak_mb": mem.peak_rss_bytes / 1e6,
            "weights_mb": mem.weights_bytes / 1e6, "weights_f32_mb": mem.weights_f32_bytes / 1e6}


def run_process(base_type: str, args, out_dir: str) -> tuple[float, float, float]:
    """One ``ggopt finetune`` run: (its peak RSS in MB, its training tokens/s, wall s)."""
    cmd = [sys.executable, "-m", "ggopt", "finetune", "--model", str(model_path(True)),
           "--base-type", base_type, "--lora", str(args.rank), "--text", GPL3, "--ctx",
           str(args.ctx), "--threads", str(args.threads), "--no-progress",
           "--out", os.path.join(out_dir, f"{base_type}.gguf"),
           "--adapter-out", os.path.join(out_dir, f"{base_type}-adapter.gguf")]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read()
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out}")
    rate = re.search(r"([0-9.]+) tokens/s", out)
    return (usage.ru_maxrss * 1024 / 1e6, float(rate.group(1)) if rate else 0.0,
            time.perf_counter() - t0)


def process_main(args) -> int:
    """``--process``: the whole command, the configurations alternating ``--rounds`` times."""
    peaks: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    print(f"load: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as out_dir:
        for _ in range(args.rounds):
            for config in args.configs.split(","):
                peak, rate, wall = run_process(config, args, out_dir)
                peaks.setdefault(config, []).append(peak)
                rates.setdefault(config, []).append(rate)
                print(f"{config}: peak RSS {peak:.0f} MB, {rate:.1f} tokens/s (training), "
                      f"{wall:.1f} s in all", flush=True)
    print(f"load: {os.getloadavg()}")
    if set(CONFIGS) <= set(peaks):
        hi = {c: max(p) for c, p in peaks.items()}
        print(f"keep / f32, the whole process: peak RSS {hi['keep']:.0f} / {hi['f32']:.0f} MB "
              f"= x{hi['keep'] / hi['f32']:.3f} (the rounds' maxima); tokens/s "
              f"x{statistics.median(rates['keep']) / statistics.median(rates['f32']):.3f} "
              f"(medians)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, CONFIGS)
    p.add_argument("--process", action="store_true",
                   help="the whole `ggopt finetune` process, one epoch (module docstring)")
    args = p.parse_args(argv)
    if args.process:
        return process_main(args)
    if args.child:
        rec = child(args.child, args.warm + args.steps, args.ctx, args.threads, args.rank)
        print(json.dumps(rec))
        return 0
    model_path(quantized=True)
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    weights: dict[str, float] = {}
    print(f"load: {os.getloadavg()}")
    for _ in range(args.rounds):
        for config in args.configs.split(","):
            cmd = [sys.executable, "-m", "bench.bench_lora_quant", "--child", config,
                   "--steps", str(args.steps), "--warm", str(args.warm), "--threads",
                   str(args.threads), "--rank", str(args.rank), "--ctx", str(args.ctx)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rec = json.loads(out.strip().splitlines()[-1])
            warm = rec["times"][args.warm:]
            times.setdefault(config, []).extend(warm)
            cpu.setdefault(config, []).extend(rec["cpu"][args.warm:])
            peaks[config] = max(peaks.get(config, 0.0), rec["peak_mb"])
            weights[config] = rec["weights_mb"]
            med = statistics.median(warm)
            print(f"{config}: median step {med:.3f} s, min {min(warm):.3f} s, "
                  f"{args.ctx / med:.1f} tokens/s, CPU time "
                  f"{statistics.median(rec['cpu'][args.warm:]):.3f} s/step; held-out loss "
                  f"{rec['val_before']:.4f} -> {rec['val_after']:.4f} after "
                  f"{len(rec['times'])} steps", flush=True)
            for line in rec["memory"]:
                print(f"  {line}")
    print(f"load: {os.getloadavg()}")
    if set(CONFIGS) <= set(times):
        med = {c: statistics.median(t) for c, t in times.items()}
        mins = {c: min(t) for c, t in times.items()}
        print(f"keep / f32: tokens/s x{med['f32'] / med['keep']:.3f} (medians), "
              f"x{mins['f32'] / mins['keep']:.3f} (minima), CPU time per step x"
              f"{statistics.median(cpu['f32']) / statistics.median(cpu['keep']):.3f}; peak RSS "
              f"{peaks['keep']:.0f} / {peaks['f32']:.0f} MB = x{peaks['keep'] / peaks['f32']:.3f}"
              f"; base weights {weights['keep']:.1f} / {weights['f32']:.1f} MB = "
              f"x{weights['keep'] / weights['f32']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
