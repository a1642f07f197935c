"""Train a small byte-level llama the way llama.cpp does: ``ggopt train``.

``train`` fits the model on text (default: a fixed list of modules of the running Python's
standard library, :data:`DEFAULT_MODULES`) with llama.cpp's training path, on the one training
loop of ggopt (:class:`ggopt.lm.FineTuner` over :func:`ggopt.lm.text_windows` of the bytes):
a fresh dynamic graph per micro-batch (``--static``: one graph), AdamW; it reports loss,
perplexity and bits per byte per epoch and writes a GGUF that llama.cpp loads.
``generate``, ``eval`` and ``tokenize`` (:mod:`.llm_infer`) sample from, evaluate and tokenize
with any llama GGUF (such a file, or a pretrained model like SmolLM2).

Progress bars and notes go to stderr; results go to stdout. Exit status: 0 on success, 1 on an
error in the input (files, shapes), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import sysconfig
from collections.abc import Sequence

import numpy as np

from .. import set_n_threads
from ..backend import Scheduler, cpu_init
from ..errors import GgoptError, InvalidValueError, ShapeError
from ..lm.finetune import EpochStats, FinetuneParams, FineTuner
from ..lm.windows import text_windows
from ..models import llama as model
from ..models.llama import byte_gguf
from ..opt import OptimizerParams
from . import llm_infer
from . import training_args as training_cli
from .common import positive, world
from .plot import plot_history, require_matplotlib

__all__ = ["main", "DEFAULT_MODULES", "default_corpus_paths", "read_corpus",
           "unigram_entropy_bits"]

#: The default corpus: these modules of the running Python's standard library, in this order
#: (read from ``sysconfig.get_paths()["stdlib"]``; about 470 KB of Python source).
DEFAULT_MODULES = (
    "argparse.py", "dataclasses.py", "functools.py", "textwrap.py", "heapq.py", "fractions.py",
    "statistics.py", "shlex.py", "pprint.py", "csv.py", "calendar.py", "base64.py",
    "random.py", "json/decoder.py", "json/encoder.py", "contextlib.py",
)
#: ``ggopt train``'s defaults: from-scratch training wants more than a fine-tune's rate
BATCH, LR, WD = 16, 3e-3, 0.0


def default_corpus_paths() -> list[str]:
    """Paths of :data:`DEFAULT_MODULES` that exist in this Python's standard library."""
    stdlib = sysconfig.get_paths()["stdlib"]
    found = [p for p in (os.path.join(stdlib, m) for m in DEFAULT_MODULES) if os.path.isfile(p)]
    if not found:
        raise ShapeError(f"default corpus: none of the modules {', '.join(DEFAULT_MODULES)} "
                         f"is in the standard library at {stdlib!r}; pass --text FILE")
    return found


def read_corpus(paths: Sequence[str | os.PathLike[str]]) -> bytes:
    """The bytes of ``paths`` concatenated (OSError for an unreadable file)."""
    chunks = []
    for path in paths:
        with open(path, "rb") as f:
            chunks.append(f.read())
    return b"".join(chunks)


def unigram_entropy_bits(tokens: np.ndarray) -> float:
    """Entropy of the byte frequencies of ``tokens``, in bits per byte."""
    counts = np.bincount(tokens, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum()) if p.size else math.nan


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ggopt",
        description="Train, sample and evaluate a byte-level llama with ggopt (GGUF that "
                    "llama.cpp runs).")
    sub = parser.add_subparsers(dest="command", required=True)
    d = model.Config()
    tr = sub.add_parser("train", help="train a model on text and save it as GGUF",
                        description="llama.cpp's training path: windows of --ctx bytes every "
                                    "--stride bytes, 5% held out, AdamW (--lr "
                                    f"{LR:g} by default here), a fresh graph per "
                                    "micro-batch, on ggopt.lm.finetune's FineTuner.")
    tr.add_argument("--text", nargs="+", metavar="FILE",
                    help="training text (any bytes); default: "
                         f"{len(DEFAULT_MODULES)} modules of Python's standard library")
    tr.add_argument("--ctx", type=positive, default=d.n_ctx, help=f"context (default {d.n_ctx})")
    tr.add_argument("--embd", type=positive, default=d.n_embd,
                    help=f"embedding size (default {d.n_embd})")
    tr.add_argument("--layers", type=positive, default=d.n_layer,
                    help=f"blocks (default {d.n_layer})")
    tr.add_argument("--heads", type=positive, default=d.n_head,
                    help=f"attention heads (default {d.n_head})")
    tr.add_argument("--heads-kv", type=positive,
                    help="key/value heads, dividing --heads (default: --heads)")
    tr.add_argument("--ff", type=positive, default=d.n_ff,
                    help=f"feed-forward size (default {d.n_ff})")
    tr.add_argument("--stride", type=positive,
                    help="bytes between window starts (default: ctx/2, as llama.cpp)")
    tr.add_argument("--batch", type=positive, default=BATCH,
                    help=f"sequences per optimizer step (default {BATCH})")
    tr.add_argument("--ubatch", type=positive,
                    help="sequences per micro-batch, dividing --batch (default: --batch)")
    tr.add_argument("--wd", type=training_cli.unit_float32, default=WD,
                    help=f"AdamW weight decay (default {WD})")
    tr.add_argument("--epochs", type=positive, default=1, help="epochs (default 1)")
    tr.add_argument("--static", action="store_true",
                    help="train through one static graph instead of a fresh graph per "
                         "micro-batch (bit-identical weights)")
    tr.add_argument("--out", metavar="FILE.gguf", default="llm.gguf",
                    help="where to save the model (default llm.gguf)")
    tr.add_argument("--plot", metavar="PNG", help="also write the losses per epoch as PNG")
    tr.add_argument("--seed", type=int, default=0, help="weight-init seed (default 0)")
    tr.add_argument("--threads", type=positive, metavar="N", help="CPU threads")
    tr.add_argument("--dist", choices=("auto", "mpi", "none"), default="auto",
                    help="data-parallel training over MPI (run under mpiexec -n N, as the MNIST "
                         "example): 'auto' (default) when an MPI launcher started more than "
                         "one process, 'mpi' always, 'none' never; --ubatch defaults to "
                         "--batch / N there")
    # from-scratch training wants more than ggml's 1e-3
    training_cli.add_training_args(tr, default_lr=LR)
    tr.set_defaults(func=_train)

    llm_infer.add_commands(sub)
    return parser


def _sched(args: argparse.Namespace) -> Scheduler:
    if args.threads is not None:
        set_n_threads(args.threads)
    return Scheduler([cpu_init()])


def _epoch_line(iepoch: int, train: EpochStats, val: EpochStats) -> str:
    """``epoch N: train loss=.. ppl=.. bits/byte=.. | val ...`` (a part without data left out)."""
    parts = [f"{name} loss={st.loss:.4f} ppl={st.ppl:.3f} bits/byte={st.loss / math.log(2):.4f}"
             for name, st in (("train", train), ("val", val)) if not math.isnan(st.loss)]
    return f"epoch {iepoch}: " + " | ".join(parts)


def _train(args: argparse.Namespace) -> int:
    paths = args.text or default_corpus_paths()
    training_cli.check_output_paths(
        [("--out", args.out), ("--checkpoint", args.checkpoint), ("--plot", args.plot)],
        [("--text", path) for path in paths])
    if args.plot:
        require_matplotlib()  # fail before training, not after
    comm = world(args)
    nranks = 1 if comm is None else comm.size
    if args.ubatch is None and args.batch % nranks:
        raise ShapeError(f"--dist: {nranks} ranks must divide --batch {args.batch}")
    cfg = model.Config(n_ctx=args.ctx, n_embd=args.embd, n_layer=args.layers,
                       n_head=args.heads, n_head_kv=args.heads_kv or args.heads, n_ff=args.ff)
    fp = FinetuneParams(n_batch=args.batch, n_ubatch=args.ubatch or args.batch // nranks,
                        lr=args.lr, wd=args.wd, static=args.static)
    fp.check()
    tokens = np.frombuffer(read_corpus(paths), np.uint8).astype(np.int32)
    stride = args.stride or max(1, cfg.n_ctx // 2)
    windows = text_windows(tokens.tolist(), cfg.n_ctx, stride)
    h1 = unigram_entropy_bits(tokens)
    rank0 = comm is None or comm.rank == 0
    log = sys.stderr if rank0 else io.StringIO()
    print(f"main: {len(tokens)} bytes from {len(paths)} file(s), unigram entropy "
          f"{h1:.4f} bits/byte; {len(windows)} windows of {cfg.n_ctx} (stride {stride})",
          file=log)
    m = model.build_model(cfg, _sched(args))
    model.set_weights(m, model.init_weights(cfg, args.seed), "init")
    base = OptimizerParams()
    base.adamw.wd = fp.wd
    schedule = training_cli.make_schedule(args, args.epochs, FineTuner.count_steps(windows, fp),
                                          base)
    tuner = FineTuner(m, windows, fp, get_opt_pars=schedule, comm=comm)
    print(f"main: {tuner.n_train_mb} training and {tuner.n_val_mb} validation micro-batches of "
          f"{fp.n_ubatch} sequences, opt_period {fp.opt_period}, "
          f"{'static' if fp.static else 'dynamic'} graphs"
          + ("" if comm is None else f", data-parallel over {comm.size} ranks"), file=log)
    resume = training_cli.resume_mode(args)
    try:
        history = tuner.fit(args.epochs, checkpoint=args.checkpoint, resume=resume,
                            progress=sys.stderr if rank0 else None)
    finally:
        tuner.close()
    if resume and history.resumed_after >= args.epochs:
        raise InvalidValueError(f"--resume: the checkpoint {args.checkpoint!r} already holds "
                                f"{history.resumed_after} epochs; ask for more than that")
    if not rank0:
        return 0
    if tuner.train_seconds:
        print(f"main: trained {tuner.train_tokens} tokens in {tuner.train_seconds:.1f} s: "
              f"{tuner.train_tokens / tuner.train_seconds:.0f} tokens/s")
    for iepoch in range(len(history)):
        train, val = (EpochStats(getattr(history, f"{part}_loss")[iepoch], 0, 0.0)
                      for part in ("train", "val"))
        print(_epoch_line(history.resumed_after + iepoch + 1, train, val))
    print(f"main: unigram entropy of the corpus: {h1:.4f} bits/byte")
    byte_gguf.save(args.out, cfg, model.get_weights(m))
    print(f"main: saved {args.out}")
    if args.plot:
        plot_history(history, args.plot, title=f"byte-level llama, {args.epochs} epochs")
        print(f"main: wrote {args.plot}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line tool with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        training_cli.check_training_args(parser, args)
    args.comm = None
    try:
        code: int = args.func(args)
        return code
    except (GgoptError, OSError, ImportError) as exc:
        message = f"llm: error: {exc}"
    if args.comm is not None:  # the other ranks would wait for this one forever
        args.comm.abort(1, message)
    print(message, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
