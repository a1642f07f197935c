"""Fine-tune a llama GGUF: ``python -m ggopt.examples.finetune --model IN.gguf --out OUT.gguf
(--text FILE... | --chat FILE.jsonl) [--lora RANK ...]``.

Validation loss and perplexity before training and after every epoch (a progress bar on
stderr while it runs); at the end ``trained N tokens in S s: X tokens/s`` (training steps only)
and the peak memory. The merged model keeps every key of the input; with ``--lora`` the adapter
is also written as llama.cpp's LoRA GGUF (``--adapter-out``), and ``--adapter IN.gguf``
continues training a saved one.

``--batch`` and ``--ubatch`` count windows of ``--ctx`` tokens (llama.cpp's ``-b``/``-ub``
count tokens): one optimizer step per ``--batch`` windows, computed ``--ubatch`` windows at a
time, the gradients accumulated in between. Epochs run on ggopt.opt.training's loop
(``train_epochs`` / ``run_batches``): ``--checkpoint``/``--resume`` continue bit for bit,
learning-rate schedule included; ``--plot`` draws the losses per epoch.

``--base-type keep`` trains the LoRA adapter on the model's weights as the file stores them
(Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and F32 matrices mapped from the file, no copy; F32 only for the
norms, the adapter and the activations). A full fine-tune (no ``--lora``/``--adapter``) trains
every weight and so needs ``--base-type f32``: the weights dequantized to F32 at load.

``--compute-type bf16`` runs the weights' products in BF16 (F32 sums): with LoRA the frozen base
is stored in BF16 (converted once at load); a full fine-tune keeps F32 weights and AdamW state
and rounds the weights to BF16 once per step (see ``--help`` and ``docs/compute-type.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

import ggopt

from ..errors import GgoptError, InvalidValueError, ShapeError
from ..lm import lora
from ..lm.chat import chat_windows, read_conversations
from ..lm.export import OUT_TYPES, export
from ..lm.finetune import EpochStats, FinetuneParams, FineTuner
from ..lm.memory import memory_report, peak_rss_bytes
from ..lm.windows import text_windows, tokenize_texts
from ..models.llama import load, weight_map
from ..models.llama.compute import COMPUTE_TYPES, load_compute_type
from ..models.llama.compute import HELP as COMPUTE_HELP
from ..models.llama.mapped import BASE_TYPES
from ..models.llama.weights import file_weights
from ..opt import OptimizerParams
from . import training_cli
from .mnist import _world  # the MNIST example's MPI set-up (--dist), shared
from .mnist_plot import plot_history, require_matplotlib

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ggopt.examples.finetune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the llama GGUF to fine-tune")
    p.add_argument("--out", required=True, help="the merged model (GGUF)")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--text", nargs="+", help="plain text files (llama.cpp's windows)")
    data.add_argument("--chat", help='JSON lines {"messages": [{"role", "content"}, ...]}')
    p.add_argument("--ctx", type=int, default=256, help="tokens per window (default 256)")
    p.add_argument("--batch", type=int, default=1,
                   help="windows (of --ctx tokens, not tokens as llama.cpp's -b) per optimizer "
                        "step (default 1)")
    p.add_argument("--ubatch", type=int, default=1,
                   help="windows per micro-batch, a divisor of --batch (default 1)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--val-split", type=float, default=0.05)
    p.add_argument("--lora", type=int, metavar="RANK", help="train a LoRA adapter of this rank")
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-targets", default=",".join(lora.TARGETS))
    p.add_argument("--adapter", help="continue training this LoRA adapter GGUF")
    p.add_argument("--adapter-out", help="write the trained adapter here (LoRA)")
    p.add_argument("--base-type", choices=BASE_TYPES, default="f32",
                   help="f32 (default): dequantize the weights to F32 at load (needed for a "
                        "full fine-tune, which trains them); keep: LoRA on the weights as the "
                        "file stores them (quantized, mapped, frozen)")
    p.add_argument("--compute-type", choices=COMPUTE_TYPES, default="f32", help=COMPUTE_HELP)
    p.add_argument("--out-type", choices=OUT_TYPES, default="f32")
    p.add_argument("--dynamic", action="store_true",
                   help="a fresh graph per micro-batch, as llama-finetune builds them (the same "
                        "bits; default: one static graph, ~0.1 s less per SmolLM2 step)")
    p.add_argument("--plot", metavar="PNG", help="also write the losses per epoch as PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    training_cli.add_training_args(p, default_lr=1e-5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dist", choices=("auto", "mpi", "none"), default="auto",
                   help="data-parallel over MPI (run under mpiexec -n N): 'auto' (default) when "
                        "an MPI launcher started more than one process, 'mpi' always, 'none' "
                        "never; N must divide --batch / --ubatch")
    p.add_argument("--seed", type=int, default=5489)
    args = p.parse_args(argv)
    for name in ("ctx", "batch", "ubatch", "epochs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    training_cli.check_training_args(p, args)
    if args.adapter_out and args.lora is None and args.adapter is None:
        p.error("--adapter-out needs --lora or --adapter")
    if args.lora is not None and args.adapter is not None:
        p.error("--lora starts a new adapter, --adapter continues one: give one of them")
    return args


def _line(name: str, s: EpochStats) -> str:
    return f"{name}: loss={s.loss:.4f} ppl={s.ppl:.3f} over {s.n_tokens} tokens"


def run(args: argparse.Namespace) -> None:
    inputs = [("--model", args.model), *(("--text", path) for path in args.text or ()),
              ("--chat", args.chat), ("--adapter", args.adapter)]
    training_cli.check_output_paths(
        [("--out", args.out), ("--adapter-out", args.adapter_out),
         ("--checkpoint", args.checkpoint), ("--plot", args.plot)],
        [(option, path) for option, path in inputs if path is not None])
    if args.plot:
        require_matplotlib()  # fail before training, not after
    if args.threads is not None:
        ggopt.set_n_threads(args.threads)
    if args.base_type == "keep" and args.lora is None and args.adapter is None:
        raise InvalidValueError("--base-type keep: a full fine-tune trains every weight, and a "
                                "quantized weight cannot train; use --base-type f32 (the "
                                "weights dequantized to F32) or train a --lora adapter")
    comm = _world(args)
    rank0 = comm is None or comm.rank == 0
    if not rank0:
        sys.stdout = open(os.devnull, "w")  # one report: rank 0 prints it
    trains_base = args.lora is None and args.adapter is None
    model = load(args.model, base_type=args.base_type, progress=rank0,
                 compute_type=load_compute_type(args.compute_type, trains_base))
    tok = model.require_tokenizer()
    texts = []
    for path in args.text or ():
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidValueError(f"--text {path!r}: cannot read: {exc}") from None
    conversations = read_conversations(args.chat) if args.chat else []
    if args.ctx > model.cfg.n_ctx:  # before any window is built (a huge --ctx would not fit)
        raise ShapeError(f"--ctx {args.ctx}: windows longer than the model's context of "
                         f"{model.cfg.n_ctx} tokens")
    windows = text_windows(tokenize_texts(tok, texts), args.ctx) if args.text else \
        chat_windows(tok, conversations, args.ctx)
    net = model.net
    adapter = None
    if args.lora is not None:
        adapter = lora.create(net, args.lora, args.lora_alpha,
                              lora.parse_targets(args.lora_targets), seed=args.seed)
    elif args.adapter is not None:
        adapter = lora.load(args.adapter, net)
    if adapter is not None:
        lora.attach(net, adapter)
        print(f"lora: {len(adapter.a)} adapted weights, {adapter.n_params()} trainable "
              f"parameters (base frozen)")
    fp = FinetuneParams(n_batch=args.batch, n_ubatch=args.ubatch, lr=args.lr, wd=args.wd,
                        val_split=args.val_split, static=not args.dynamic, seed=args.seed,
                        compute_type=args.compute_type)
    base = OptimizerParams()
    base.adamw.wd = fp.wd
    n_steps = FineTuner.count_steps(windows, fp)
    schedule = training_cli.make_schedule(args, args.epochs, n_steps, base)
    ft = FineTuner(net, windows, fp, schedule, comm)
    print(f"data: {len(windows)} windows of {args.ctx} tokens, {ft.n_train_mb * args.ubatch} "
          f"for training, {ft.n_val_mb * args.ubatch} held out; {ft.steps_per_epoch} optimizer "
          f"steps of {args.batch} window(s) per epoch")
    progress = None if args.no_progress or not rank0 else sys.stderr

    def epoch_line(epoch: int, train: EpochStats, val: EpochStats) -> None:
        line = f"epoch {epoch}: train loss={train.loss:.4f}"
        if ft.n_val_mb:
            line += " | " + _line("val", val)
        print(line, flush=True)

    try:
        if args.resume or args.resume_force:
            print(f"resuming from {args.checkpoint}")
        elif ft.n_val_mb:
            print(_line("val before", ft.validate(progress)), flush=True)
        history = ft.fit(args.epochs, args.checkpoint, training_cli.resume_mode(args), epoch_line,
                         progress)
        if history.resumed_after:
            print(f"resumed after epoch {history.resumed_after}")
        print("\n".join(memory_report(ft).lines()), flush=True)
    finally:
        ft.close()
    if history.resumed_after >= args.epochs:
        raise InvalidValueError(f"--resume: the checkpoint {args.checkpoint!r} already holds "
                                f"{history.resumed_after} epochs; ask for more --epochs")
    if not rank0:
        return  # every rank holds the same weights; rank 0 writes them
    weights: Mapping[str, np.ndarray] = weight_map(net)  # one tensor at a time in F32
    if model.compute_type == "bf16" and model.base_type == "f32":
        weights = file_weights(args.model)  # the file's values, not the base's BF16 rounding
    unchanged: set[str] = set()  # LoRA: the frozen base outside the adapted weights
    if adapter is not None:
        unchanged = set(weights) - set(adapter.a)
        weights = lora.merged(weights, adapter)
    # the model first: export refuses non-finite weights (a diverged run) before writing
    report = export(args.model, args.out, weights, args.out_type, unchanged)
    print(f"model written to {args.out} ({args.out_type}: {report.summary()})")
    if adapter is not None and args.adapter_out:
        lora.save(args.adapter_out, adapter)
        print(f"adapter written to {args.adapter_out}")
    if args.plot:
        plot_history(history, args.plot, title=f"fine-tune of {os.path.basename(args.model)}")
        print(f"plot written to {args.plot}")
    rate = ft.train_tokens / ft.train_seconds if ft.train_seconds else 0.0
    print(f"trained {ft.train_tokens} tokens in {ft.train_seconds:.1f} s: {rate:.1f} tokens/s")
    peak = peak_rss_bytes() / 1e6
    print(f"peak memory: {peak:.0f} MB (max RSS, the export included)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out == args.model or (args.adapter_out and os.path.abspath(args.adapter_out) ==
                                  os.path.abspath(args.model)):
        print("error: refusing to overwrite the input model", file=sys.stderr)
        return 2
    args.comm = None
    try:
        run(args)
    except (GgoptError, OSError) as exc:
        message = f"error: {exc}"
        if args.comm is not None:  # the other ranks would wait for this one forever
            args.comm.abort(1, message)
        print(message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
