"""Train a small byte-level llama the way llama.cpp does: ``ggopt train``.

``train`` fits the model on text (default: a fixed list of modules of the running Python's
standard library, see :data:`llm_data.DEFAULT_MODULES`) with llama.cpp's training path: an
I32 token dataset, a fresh dynamic graph per micro-batch, AdamW; it reports loss, next-token
accuracy, perplexity and bits per byte per epoch and writes a GGUF that llama.cpp loads.
``generate``, ``eval`` and ``tokenize`` (:mod:`.llm_infer`) sample from, evaluate and tokenize
with any llama GGUF (such a file, or a pretrained model like SmolLM2).

Progress bars and notes go to stderr; results go to stdout. Exit status: 0 on success, 1 on an
error in the input (files, shapes), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
from collections.abc import Sequence

from .. import set_n_threads
from ..backend import Scheduler, cpu_init
from ..errors import GgoptError, ShapeError
from ..examples import llm_data as data
from ..examples import llm_train as training
from ..models import llama as model
from ..models.llama import byte_gguf
from ..opt import OptimizerParams
from . import llm_infer
from . import training_args as training_cli
from .common import positive, world
from .plot import plot_history, require_matplotlib

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ggopt",
        description="Train, sample and evaluate a byte-level llama with ggopt (GGUF that "
                    "llama.cpp runs).")
    sub = parser.add_subparsers(dest="command", required=True)
    d = model.Config()
    t = training.TrainParams()
    tr = sub.add_parser("train", help="train a model on text and save it as GGUF",
                        description="llama.cpp's training path: windows of --ctx bytes every "
                                    "--stride bytes, 5%% held out, AdamW (--lr "
                                    f"{t.lr:g} by default here), a fresh graph per "
                                    "micro-batch.")
    tr.add_argument("--text", nargs="+", metavar="FILE",
                    help="training text (any bytes); default: "
                         f"{len(data.DEFAULT_MODULES)} modules of Python's standard library")
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
    tr.add_argument("--batch", type=positive, default=t.n_batch,
                    help=f"sequences per optimizer step (default {t.n_batch})")
    tr.add_argument("--ubatch", type=positive,
                    help="sequences per micro-batch, dividing --batch (default: --batch)")
    tr.add_argument("--wd", type=training_cli.unit_float32, default=t.wd,
                    help=f"AdamW weight decay (default {t.wd})")
    tr.add_argument("--epochs", type=positive, default=1, help="epochs (default 1)")
    tr.add_argument("--static", action="store_true",
                    help="train through one static graph instead of a fresh graph per "
                         "micro-batch (bit-identical weights)")
    tr.add_argument("--out", metavar="FILE.gguf", default="llm.gguf",
                    help="where to save the model (default llm.gguf)")
    tr.add_argument("--plot", metavar="PNG", help="also write loss/accuracy per epoch as PNG")
    tr.add_argument("--seed", type=int, default=0, help="weight-init seed (default 0)")
    tr.add_argument("--threads", type=positive, metavar="N", help="CPU threads")
    tr.add_argument("--dist", choices=("auto", "mpi", "none"), default="auto",
                    help="data-parallel training over MPI (run under mpiexec -n N, as the MNIST "
                         "example): 'auto' (default) when an MPI launcher started more than "
                         "one process, 'mpi' always, 'none' never; --ubatch defaults to "
                         "--batch / N there")
    # from-scratch training wants more than ggml's 1e-3
    training_cli.add_training_args(tr, default_lr=t.lr)
    tr.set_defaults(func=_train)

    llm_infer.add_commands(sub)
    return parser


def _sched(args: argparse.Namespace) -> Scheduler:
    if args.threads is not None:
        set_n_threads(args.threads)
    return Scheduler([cpu_init()])


def _train(args: argparse.Namespace) -> int:
    paths = args.text or data.default_corpus_paths()
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
    tp = training.TrainParams(n_batch=args.batch, n_ubatch=args.ubatch or args.batch // nranks,
                              lr=args.lr, wd=args.wd, static=args.static)
    tp.check()
    tokens = data.tokenize(data.read_corpus(paths))
    stride = args.stride or max(1, cfg.n_ctx // 2)
    dataset = data.make_dataset(tokens, cfg.n_ctx, stride, "llm train")
    h1 = data.unigram_entropy_bits(tokens)
    rank0 = comm is None or comm.rank == 0
    log = sys.stderr if rank0 else io.StringIO()
    print(f"main: {len(tokens)} bytes from {len(paths)} file(s), unigram entropy "
          f"{h1:.4f} bits/byte; {dataset.ndata} windows of {cfg.n_ctx} (stride {stride})",
          file=log)

    m = model.build_model(cfg, _sched(args))
    model.set_weights(m, model.init_weights(cfg, args.seed), "init")
    ntrain, nval = training.split(dataset.ndata, tp)
    base = OptimizerParams()
    base.adamw.wd = tp.wd
    schedule = training_cli.make_schedule(args, args.epochs, ntrain // tp.opt_period, base)
    trainer = training.Trainer(m, tp, comm=comm, schedule=schedule)
    print(f"main: {ntrain} training and {nval} validation micro-batches of {tp.n_ubatch} "
          f"sequences, opt_period {tp.opt_period}, {'static' if tp.static else 'dynamic'} "
          f"graphs" + ("" if comm is None else f", data-parallel over {comm.size} ranks"),
          file=log)
    t0 = time.perf_counter()
    history = trainer.fit(dataset, args.epochs, silent=not rank0, stream=sys.stderr,
                          checkpoint=args.checkpoint,
                          resume=training_cli.resume_mode(args))
    seconds = time.perf_counter() - t0
    trainer.close()
    if not rank0:
        return 0
    tim = trainer.timing
    if tim.n:
        ntok = tim.n * cfg.n_ctx * tp.n_ubatch
        print(f"main: trained {len(history)} epoch(s) in {seconds:.1f} s; "
              f"{tim.total / tim.n * 1e3:.2f} ms per training micro-batch "
              f"({ntok / tim.total:.0f} tokens/s), of which graph build + prepare_alloc + alloc "
              f"{tim.build / tim.n * 1e3:.3f} ms ({100 * tim.build_share:.1f} %)")
    first = args.epochs - len(history)  # epochs done before a resume
    for iepoch in range(len(history)):
        line = []
        for part in ("train", "val"):
            loss = getattr(history, f"{part}_loss")[iepoch]
            if not math.isnan(loss):
                acc = getattr(history, f"{part}_acc")[iepoch]
                line.append(f"{part} loss={loss:.4f} acc={100 * acc:.2f}% "
                            f"ppl={math.exp(loss):.3f} "
                            f"bits/byte={training.bits_per_byte(loss):.4f}")
        print(f"epoch {first + iepoch + 1}: " + " | ".join(line))
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
