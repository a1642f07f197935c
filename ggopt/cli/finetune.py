"""Fine-tune a llama GGUF: ggopt finetune --model IN.gguf --out OUT.gguf
(--text FILE... | --chat FILE.jsonl) [--lora RANK ...]

Every input is checked before the model loads. Validation loss and perplexity are printed
before training and after every epoch (a progress bar on stderr while it runs: loss,
perplexity, tokens/s, ETA); at the end the tokens trained (those with a label: the assistant's
in chat data), the speed and the peak memory.

Output: the merged model (--out, F32 by default: it keeps every bit of what was trained; a
lossy --out-type is measured and warned about when it loses most of the fine-tune). With
--lora, the adapter beside the unchanged base (--adapter-out, llama.cpp's LoRA GGUF: llama-cli
-m IN.gguf --lora ADAPTER.gguf) is the lossless small form, the one to use for a quantized
base; --adapter IN.gguf continues training a saved one.

--batch and --ubatch count windows of --ctx tokens (llama.cpp's -b/-ub count tokens): one
optimizer step per --batch windows, computed --ubatch windows at a time. --checkpoint/--resume
continue bit for bit, the learning-rate schedule included; Ctrl-C stops with one line.

--base-type keep trains the LoRA adapter on the model's weights as the file stores them
(Q4_0 ... Q8_0, Q2_K ... Q6_K, F16, BF16 and F32 matrices mapped from the file); a full
fine-tune (no --lora) trains every weight and so needs --base-type f32 (the weights dequantized
at load).

--compute-type bf16 runs the weights' products in BF16 (F32 sums): with LoRA the frozen base
is stored in BF16 (converted once at load); a full fine-tune keeps F32 weights and AdamW state
and rounds the weights to BF16 once per step (docs/compute-type.md).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import ggopt

from ..errors import GgoptError, InvalidValueError, StateError
from ..lm import lora, preflight
from ..lm.chat import OVERFLOW, chat_windows, read_conversations
from ..lm.completions import completion_windows, data_format, read_completions
from ..lm.controls import StepControls, StepMonitor, read_log
from ..lm.export import OUT_TYPES, check_exportable, export
from ..lm.finetune import EpochStats, FinetuneParams, FineTuner
from ..lm.memory import memory_report, peak_rss_bytes
from ..lm.windows import text_windows, tokenize_texts
from ..models import load
from ..models.llama import weight_map
from ..models.llama.compute import COMPUTE_TYPES, load_compute_type
from ..models.llama.compute import HELP as COMPUTE_HELP
from ..models.llama.mapped import BASE_TYPES
from ..models.llama.weights import file_weights
from ..opt import OptimizerParams
from ..opt.checks import check_float32
from ..opt.schedule import Schedule
from ..tokenizers.templates import BUILTIN, resolve_template
from . import training_args as training_cli
from .common import world
from .plot import plot_history, plot_log, require_matplotlib

__all__ = ["main", "parse_args", "build_parser", "check_inputs", "LR_FULL", "LR_LORA"]


#: learning rates when --lr is not given: a full fine-tune (llama.cpp finetune's) and LoRA
#: (PEFT's common 1e-4; at 1e-5 a SmolLM2 LoRA barely moves in an epoch, docs/fine-tune-options.md)
LR_FULL, LR_LORA = 1e-5, 1e-4


def _sci(x: float) -> str:
    """``1e-4`` for 0.0001."""
    return f"{x:.0e}".replace("e-0", "e-")


def build_parser() -> argparse.ArgumentParser:
    """The command's parser (every option with its help and default)."""
    p = argparse.ArgumentParser(prog="ggopt finetune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="FILE.gguf",
                   help="the llama GGUF to fine-tune (required)")
    p.add_argument("--out", required=True, metavar="FILE.gguf",
                   help="the merged model (GGUF; required)")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--text", nargs="+", metavar="FILE",
                      help="plain UTF-8 text files, cut into llama.cpp's windows (required: "
                           "--text or --chat)")
    data.add_argument("--chat", metavar="FILE.jsonl",
                      help='JSON lines {"messages": [{"role", "content"}, ...]}: the loss on '
                           'the assistant\'s tokens only; or {"prompt": ..., "completion": '
                           "...}: the loss on the completion (required: --text or --chat)")
    p.add_argument("--chat-template", metavar="FILE|NAME",
                   help="the chat template for --chat data instead of the model's "
                        "tokenizer.chat_template: a jinja file (compiled and rendered in the "
                        "same sandbox and limits as a GGUF's template) or a built-in name "
                        f"({', '.join(BUILTIN)}: Gemma 3's turns); it is written into the "
                        "merged GGUF's tokenizer.chat_template, so --out is self-contained "
                        "(default: the model's own)")
    p.add_argument("--ctx", type=int, default=256, help="tokens per window (default 256)")
    p.add_argument("--chat-overflow", choices=OVERFLOW, default="truncate",
                   help="a conversation longer than a window: keep its start (truncate, the "
                        "default; the loss on the assistant tokens that fit), skip it, or "
                        "stop (error)")
    p.add_argument("--chat-pack", action="store_true",
                   help="several conversations per window (first-fit in data order), each "
                        "attending only to itself (positions from 0, a block-diagonal causal "
                        "mask): the same loss per token with far less padding. Off by default: "
                        "it changes which conversations share a window and an optimizer step, "
                        "so the results differ from the padded run's (not only the speed); "
                        "tokens/s counts real tokens either way")
    p.add_argument("--batch", type=int, default=1,
                   help="windows (of --ctx tokens, not tokens as llama.cpp's -b) per optimizer "
                        "step (default 1)")
    p.add_argument("--ubatch", type=int, default=1,
                   help="windows per micro-batch, a divisor of --batch (default 1)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the data (default 1)")
    p.add_argument("--wd", type=training_cli.unit_float32, default=0.0,
                   help="AdamW weight decay, 0 to 1 (default 0)")
    p.add_argument("--grad-clip", type=float, metavar="MAX_NORM",
                   help="clip the gradients as PyTorch's clip_grad_norm_: when their global L2 "
                        "norm over an optimizer step exceeds MAX_NORM (> 0), scale them all by "
                        "MAX_NORM / (norm + 1e-6) (default: no clipping)")
    p.add_argument("--val-split", type=float, default=0.05,
                   help="fraction of the windows held out for validation (default 0.05)")
    p.add_argument("--lora", type=int, metavar="RANK",
                   help="train a LoRA adapter of this rank (default: a full fine-tune)")
    p.add_argument("--lora-alpha", type=float, default=16.0,
                   help="LoRA alpha: the adapter's scale is alpha / rank (default 16)")
    p.add_argument("--lora-targets", default=",".join(lora.TARGETS),
                   help=f"the projections to adapt, comma-separated (default "
                        f"{','.join(lora.TARGETS)})")
    p.add_argument("--lora-dropout", type=float, default=0.0, metavar="P",
                   help="PEFT's LoRA dropout: while training, drop the adapter's input out "
                        "with probability P, 0 <= P < 1 (default 0: none)")
    p.add_argument("--adapter", metavar="FILE.gguf",
                   help="continue training this LoRA adapter GGUF (default: none)")
    p.add_argument("--adapter-out", metavar="FILE.gguf",
                   help="also write the trained adapter (llama.cpp's LoRA GGUF) here: beside "
                        "the unchanged base it keeps all of the training at a fraction of the "
                        "size (default: not written)")
    p.add_argument("--base-type", choices=BASE_TYPES, default="f32",
                   help="f32 (default): dequantize the weights to F32 at load (needed for a "
                        "full fine-tune, which trains them); keep: LoRA on the weights as the "
                        "file stores them (quantized, mapped, frozen)")
    p.add_argument("--compute-type", choices=COMPUTE_TYPES, default="f32", help=COMPUTE_HELP)
    p.add_argument("--out-type", choices=OUT_TYPES, default="f32",
                   help="the merged model's type: f32 (default) keeps every bit of the "
                        "training; f16, bf16, q8_0 for the matrices; keep: each tensor in the "
                        "input's type (a LoRA delta below a Q4 step is mostly lost: the run "
                        "measures it and warns)")
    p.add_argument("--dynamic", action="store_true",
                   help="a fresh graph per micro-batch, as llama-finetune builds them (the same "
                        "bits; default: one static graph, ~0.1 s less per SmolLM2 step)")
    p.add_argument("--plot", metavar="PNG",
                   help="also write the losses per epoch (validation before training "
                        "included) as PNG (default: none)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr: loading, training, validation (default: shown)")
    c = p.add_argument_group("step controls")
    c.add_argument("--max-steps", type=int, metavar="N",
                   help="stop after N optimizer steps in all (default: the epochs decide)")
    c.add_argument("--eval-every", type=int, metavar="N",
                   help="validate every N optimizer steps, and write the best evaluated state "
                        "(default: validate after each epoch, write the last state)")
    c.add_argument("--patience", type=int, metavar="K",
                   help="early stopping: stop after K evaluations without a better validation "
                        "loss (needs --eval-every; default: no early stopping)")
    c.add_argument("--save-every", type=int, metavar="N",
                   help="also save --checkpoint every N optimizer steps, mid-epoch (default: "
                        "at the ends of epochs, and on Ctrl-C)")
    c.add_argument("--log", metavar="FILE.jsonl",
                   help="a JSON line per optimizer step: step, epoch, loss, lr, tokens_per_s, "
                        "val_loss when validated; --plot draws it per step (default: none)")
    training_cli.add_training_args(
        p, default_lr=None,
        lr_help=f"learning rate (peak rate with a schedule; default {_sci(LR_LORA)} with "
                f"--lora or --adapter, {_sci(LR_FULL)} for a full fine-tune)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: all cores)")
    p.add_argument("--dist", choices=("auto", "mpi", "none"), default="auto",
                   help="data-parallel over MPI (run under mpiexec -n N): 'auto' (default) when "
                        "an MPI launcher started more than one process, 'mpi' always, 'none' "
                        "never; N must divide --batch / --ubatch")
    p.add_argument("--seed", type=int, default=5489,
                   help="seed of the data order and the LoRA initialization (default 5489)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    for name in ("ctx", "batch", "ubatch", "epochs", "max_steps", "eval_every", "patience",
                 "save_every"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.save_every is not None and not args.checkpoint:
        p.error("--save-every needs --checkpoint FILE")
    if args.patience is not None and args.eval_every is None:
        p.error("--patience counts evaluations: give --eval-every N")
    if args.lr is None:
        args.lr = LR_FULL if args.lora is None and args.adapter is None else LR_LORA
    training_cli.check_training_args(p, args)
    if args.adapter_out and args.lora is None and args.adapter is None:
        p.error("--adapter-out needs --lora or --adapter")
    if args.lora_dropout != 0.0 and args.lora is None and args.adapter is None:
        p.error("--lora-dropout needs --lora or --adapter (it drops out an adapter's input)")
    if args.lora is not None and args.adapter is not None:
        p.error("--lora starts a new adapter, --adapter continues one: give one of them")
    return args


def check_inputs(args: argparse.Namespace) -> tuple[preflight.ModelInfo, list[str], list[Any]]:
    """Everything checkable before the model loads (its keys and tensor list read, no tensor
    data): the paths, the model (not an adapter), the text (UTF-8) or chat data, the LoRA rank
    and targets, --ctx against the model's context and the memory, the state to resume.
    Returns the model's info, the texts and the conversations."""
    inputs = [("--model", args.model), *(("--text", path) for path in args.text or ()),
              ("--chat", args.chat), ("--adapter", args.adapter),
              ("--chat-template", None if args.chat_template in BUILTIN else args.chat_template)]
    training_cli.check_output_paths(
        [("--out", args.out), ("--adapter-out", args.adapter_out),
         ("--checkpoint", args.checkpoint), ("--plot", args.plot), ("--log", args.log)],
        [(option, path) for option, path in inputs if path is not None])
    if args.grad_clip is not None:
        check_float32(args.grad_clip, "--grad-clip", "", low=0.0, low_open=True)
    if args.plot:
        require_matplotlib()  # fail before training, not after
    if args.base_type == "keep" and args.lora is None and args.adapter is None:
        raise InvalidValueError("--base-type keep: a full fine-tune trains every weight, and a "
                                "quantized weight cannot train; use --base-type f32 (the "
                                "weights dequantized to F32) or train a --lora adapter")
    lora.check_dropout(args.lora_dropout, "--lora-dropout")
    info = preflight.model_info(args.model)
    args.template = None if args.chat_template is None else resolve_template(args.chat_template)
    texts = preflight.read_texts(args.text or ())
    conversations: list[Any] = []
    if args.chat:
        args.chat_format = data_format(args.chat)
        conversations = (read_completions if args.chat_format == "completion"
                         else read_conversations)(args.chat)
        if args.chat_pack and args.chat_format == "completion":
            raise InvalidValueError('--chat-pack packs {"messages": ...} conversations; '
                                    "prompt/completion pairs are padded (drop --chat-pack)")
    elif args.chat_pack:
        raise InvalidValueError("--chat-pack packs chat conversations: it needs --chat")
    if args.lora is not None:
        preflight.check_lora(info, args.lora, args.lora_targets)
    preflight.check_ctx(info, args.ctx, args.ubatch)
    if args.resume or args.resume_force:
        done, run = preflight.checkpoint_run(args.checkpoint)
        if "ctx" in run and run["ctx"] != args.ctx and not args.resume_force:
            raise StateError(f"--resume: ctx differs: {args.checkpoint!r} was saved by a run "
                             f"with --ctx {run['ctx']}, this one asks for --ctx {args.ctx} "
                             f"(other windows: not bit-exact); give --ctx {run['ctx']}, or "
                             f"--resume-force")
        if done >= args.epochs:
            raise InvalidValueError(f"--resume: the checkpoint {args.checkpoint!r} already "
                                    f"holds {done} epochs; ask for more --epochs")
    return info, texts, conversations


def _line(name: str, s: EpochStats) -> str:
    return f"{name}: loss={s.loss:.4f} ppl={s.ppl:.3f} over {s.n_tokens} tokens"


class Interrupted(Exception):
    """Ctrl-C stopped the run after a whole step (the state saved with --checkpoint)."""


@contextlib.contextmanager
def _stop_on_interrupt(ft: FineTuner, graceful: bool) -> Iterator[None]:
    """With ``graceful``: the first Ctrl-C stops ``ft`` after the step in progress (its
    state then saved), a second one at once; else Ctrl-C as usual."""
    if not graceful:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if ft.stop_requested:
            raise KeyboardInterrupt
        ft.request_stop()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def run(args: argparse.Namespace) -> None:
    info, texts, conversations = check_inputs(args)
    if args.threads is not None:
        ggopt.set_n_threads(args.threads)
    comm = world(args)
    rank0 = comm is None or comm.rank == 0
    if not rank0:
        sys.stdout = open(os.devnull, "w")  # one report: rank 0 prints it
    trains_base = args.lora is None and args.adapter is None
    model = load(args.model, base_type=args.base_type, progress=rank0 and not args.no_progress,
                 compute_type=load_compute_type(args.compute_type, trains_base))
    tok = model.require_tokenizer()
    if args.template is not None:
        tok = model.tokenizer = tok.with_chat_template(args.template)
    check_exportable(args.model)  # the export at the end cannot fail on the input's keys
    if args.text:
        windows = text_windows(tokenize_texts(tok, texts), args.ctx)
    elif args.chat_format == "completion":
        windows = completion_windows(tok, conversations, args.ctx)
    else:
        windows = chat_windows(tok, conversations, args.ctx, args.chat_overflow,
                               pack=args.chat_pack)
        if windows.packed:
            kept = len(conversations) - windows.overflow.skipped
            print(f"chat data: {kept} conversations packed into {len(windows)} "
                  f"windows of {args.ctx} tokens ({windows.real_tokens()} real tokens, "
                  f"{windows.real_tokens() / windows.tokens.size:.0%} of the positions)")
        if windows.overflow.line(args.ctx):
            print(windows.overflow.line(args.ctx), file=sys.stderr)
    net = model.net
    adapter = None
    if args.lora is not None:
        adapter = lora.create(net, args.lora, args.lora_alpha,
                              lora.parse_targets(args.lora_targets), seed=args.seed)
    elif args.adapter is not None:
        adapter = lora.load(args.adapter, net)
    if adapter is not None:
        adapter.dropout = args.lora_dropout
        lora.attach(net, adapter)
        print(f"lora: {len(adapter.a)} adapted weights, {adapter.n_params()} trainable "
              f"parameters (base frozen), lr {args.lr:g}"
              f"{f', dropout {args.lora_dropout:g}' if args.lora_dropout else ''}")
    fp = FinetuneParams(n_batch=args.batch, n_ubatch=args.ubatch, lr=args.lr, wd=args.wd,
                        val_split=args.val_split, static=not args.dynamic, seed=args.seed,
                        compute_type=args.compute_type, grad_clip=args.grad_clip)
    base = OptimizerParams()
    base.adamw.wd = fp.wd
    n_steps = FineTuner.count_steps(windows, fp)
    schedule = training_cli.make_schedule(args, args.epochs, n_steps, base)
    ft = FineTuner(net, windows, fp, schedule, comm)
    print(f"data: {len(windows)} windows of {args.ctx} tokens ({windows.n_trained()} with a "
          f"label), {ft.n_train_mb * args.ubatch} for training, {ft.n_val_mb * args.ubatch} "
          f"held out; {ft.steps_per_epoch} optimizer steps of {args.batch} window(s) per epoch")
    progress = None if args.no_progress or not rank0 else sys.stderr
    if (args.eval_every or args.patience) and not ft.n_val_mb:
        raise InvalidValueError("--eval-every/--patience: no held-out windows to validate on "
                                "(--val-split is 0 or the data too short)")
    log = open(args.log, "w", encoding="utf-8") if args.log and rank0 else None
    monitor = None
    if args.max_steps or args.eval_every or log is not None:
        monitor = StepMonitor(StepControls(args.max_steps, args.eval_every, args.patience, log),
                              ft.trainable, lambda: ft.validate().loss,
                              say=lambda line: print(line, flush=True))
        ft.monitor = monitor

    def epoch_line(epoch: int, train: EpochStats, val: EpochStats) -> None:
        line = f"epoch {epoch}: train loss={train.loss:.4f}"
        if ft.n_val_mb:
            line += " | " + _line("val", val)
        print(line, flush=True)
        if monitor is not None:
            step = ft.schedule.step if isinstance(ft.schedule, Schedule) else 0
            monitor.evaluated(step, val.loss)
            monitor.write({"step": step, "epoch": epoch, "train_loss": train.loss,
                           "val_loss": val.loss if ft.n_val_mb else None})

    before = math.nan
    try:
        if args.resume or args.resume_force:
            print(f"resuming from {args.checkpoint}")
        elif ft.n_val_mb:
            val0 = ft.validate(progress)
            before = val0.loss
            print(_line("val before", val0), flush=True)
            if monitor is not None:
                monitor.evaluated(0, before)
                monitor.write({"step": 0, "val_loss": before})
        ft.save_every = args.save_every
        with _stop_on_interrupt(ft, comm is None and args.checkpoint is not None):
            history = ft.fit(args.epochs, args.checkpoint, training_cli.resume_mode(args),
                             epoch_line, progress)
        if ft.stop_requested:
            raise Interrupted(history.stopped)
        if history.resumed_after:
            print(f"resumed after epoch {history.resumed_after}")
        if history.stopped:
            print(f"stopped: {history.stopped}")
        if monitor is not None and args.eval_every and monitor.restore_best():
            print(f"best evaluated state: step {monitor.best_step}, val loss "
                  f"{monitor.best_loss:.4f} (written)")
        print("\n".join(memory_report(ft).lines()), flush=True)
    finally:
        ft.close()
        if log is not None:
            log.close()
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
    report = export(args.model, args.out, weights, args.out_type, unchanged,
                    chat_template=args.template)
    print(f"model written to {args.out} ({report.summary()})")
    warning = report.loss_warning()
    if warning:
        print(f"warning: --out-type {args.out_type}: {warning}", file=sys.stderr)
    if adapter is not None and args.adapter_out:
        lora.save(args.adapter_out, adapter)
        print(f"adapter written to {args.adapter_out} (use it beside the unchanged base: "
              f"llama-cli -m {args.model} --lora {args.adapter_out})")
    elif adapter is not None and info.quantized:
        print(f"note: the base is quantized ({info.types_text()}): the adapter beside the "
              f"unchanged base "
              f"(--adapter-out FILE) keeps all of the training at a fraction of the merged "
              f"model's size")
    if args.plot:
        title = f"fine-tune of {os.path.basename(args.model)}"
        if args.log:
            plot_log(read_log(args.log), args.plot, title=title)
        else:
            plot_history(history, args.plot, title=title, before=before)
        print(f"plot written to {args.plot}")
    rate = ft.real_tokens / ft.train_seconds if ft.train_seconds else 0.0
    print(f"trained on {ft.trained_tokens} tokens (the labelled ones; {ft.train_tokens} computed)"
          f" in {ft.train_seconds:.1f} s: {rate:.1f} tokens/s ({ft.real_tokens} real tokens, "
          f"the padding left out)")
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
    except Interrupted as exc:
        print(f"{exc} (--resume continues it)", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        saved = f"; the last saved state is in {args.checkpoint}" if args.checkpoint else ""
        print(f"interrupted{saved}", file=sys.stderr)
        return 130
    except (GgoptError, OSError) as exc:
        message = f"error: {exc}"
        if args.comm is not None:  # the other ranks would wait for this one forever
            args.comm.abort(1, message)
        print(message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
