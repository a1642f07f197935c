"""ggml's MNIST example as a command line tool: ``ggopt mnist train|eval``.

``train`` fits "mnist-fc" or "mnist-cnn" with ggml's recipe (cross-entropy, AdamW defaults,
logical batch 1000 in physical batches of 500, 5% validation), evaluates on the test set and
writes a GGUF file that ggml's ``mnist-eval`` loads. ``eval`` loads such a file (also one
written by ggml's ``mnist-train``) and prints what ``mnist-eval`` prints.

Progress bars and notes go to stderr; results go to stdout. Exit status: 0 on success, 1 on an
error in the input (files, shapes), 2 on a usage error or an unavailable device.

``train`` under ``mpiexec -n N`` trains data-parallel on N ranks (``--dist``, default ``auto``:
whenever an MPI launcher started more than one process); rank 0 prints and writes the files,
and an error on any rank ends every rank. See ``docs/distributed.md``.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Sequence

import numpy as np

from .. import distributed, set_n_threads
from ..backend import Scheduler
from ..errors import BackendUnavailableError, GgoptError, ShapeError
from ..models.mnist import data, model
from ..opt import Dataset, FitHistory, Result
from ..opt.training import fit_split
from . import training_args as training_cli
from .common import positive, world
from .plot import plot_history, require_matplotlib

__all__ = ["main", "SUBSET_EPOCHS", "FULL_EPOCHS"]

FULL_EPOCHS = 30  # ggml's mnist-train
SUBSET_EPOCHS = 20  # keeps the default run on the bundled 4000 images to seconds
VAL_SPLIT = 0.05  # ggml's mnist-train
_ARCHS = {"fc": "mnist-fc", "cnn": "mnist-cnn"}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="DIR",
                   help="directory with MNIST's four IDX files (raw or .gz); default: the "
                        "subset bundled with ggopt (4000 train / 1000 test images)")
    p.add_argument("--threads", type=positive, metavar="N",
                   help="CPU threads for kernels and BLAS (default: all cores)")
    p.add_argument("--device", choices=("cpu", "cupy"), default="cpu",
                   help="'cupy': compute on the GPU through CuPy, the CPU as fallback")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the weight initialisation (train) or of the test image shown "
                        "(eval); default 0")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ggopt mnist",
        description="Train and evaluate ggml's MNIST models with ggopt (GGUF in and out).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser(
        "train", help="train a model, evaluate it on the test set, save it as GGUF",
        description="Train with ggml's recipe: cross-entropy, AdamW (lr 1e-3), 1000 images "
                    "per optimizer step in physical batches of 500, 5% held out for "
                    "validation. Weights start from N(0, 0.01) drawn with --seed, so runs "
                    "with the same seed give the same model on any thread count (ggml "
                    "seeds from the system's random device).",
    )
    tr.add_argument("--arch", choices=tuple(_ARCHS), required=True,
                    help="fc: 784-500-10 MLP (mnist-fc); cnn: two 3x3 conv + max-pool layers "
                         "and a dense layer (mnist-cnn)")
    tr.add_argument("--epochs", type=positive, metavar="N",
                    help=f"epochs to train (default: {FULL_EPOCHS} with --data, as ggml; "
                         f"{SUBSET_EPOCHS} on the bundled subset)")
    tr.add_argument("--out", metavar="FILE.gguf",
                    help="where to save the model (default: mnist-<arch>.gguf)")
    tr.add_argument("--init", choices=model.INIT_SCHEMES, default="ggml",
                    help="weight initialisation: ggml's N(0, 0.01) (default) or He-normal with "
                         "zero biases (not ggml's recipe; the CNN reaches higher accuracy)")
    tr.add_argument("--plot", metavar="PNG",
                    help="also write loss and accuracy per epoch as a PNG (needs matplotlib: "
                         "pip install 'ggopt[plot]')")
    tr.add_argument("--dist", choices=("auto", "mpi", "none"), default="auto",
                    help="data-parallel training over MPI (run under mpiexec -n N; needs "
                         "pip install 'ggopt[mpi]'): 'auto' (default) when an MPI launcher "
                         "started more than one process, 'mpi' always, 'none' never. Without "
                         "--threads each rank takes its share of the machine's cores")
    _common(tr)
    training_cli.add_training_args(tr)
    tr.set_defaults(func=_train)
    ev = sub.add_parser(
        "eval", help="evaluate a GGUF model on the test set, as ggml's mnist-eval",
        description="Load an mnist-fc or mnist-cnn GGUF file, draw one test digit with its "
                    "prediction and print the test loss and accuracy.",
    )
    ev.add_argument("--model", required=True, metavar="FILE.gguf", help="the model to load")
    _common(ev)
    ev.set_defaults(func=_eval)
    return parser


def _setup(args: argparse.Namespace) -> Scheduler:
    if args.threads is not None:
        set_n_threads(args.threads)
    return model.make_scheduler(args.device)


def _evaluate(m: model.MnistModel, ds: Dataset) -> Result:
    t0 = time.perf_counter()
    result = model.evaluate(m, ds)
    dt = time.perf_counter() - t0
    print(f"mnist_model_eval: model evaluation on {ds.ndata} images took {1e3 * dt:.2f} ms, "
          f"{1e6 * dt / ds.ndata:.2f} us/image", file=sys.stderr)
    return result


def _print_result(result: Result) -> None:
    loss, loss_unc = result.loss()
    acc, acc_unc = result.accuracy()
    print(f"main: test_loss={loss:.6f}+-{loss_unc:.6f}")
    print(f"main: test_acc={100 * acc:.2f}+-{100 * acc_unc:.2f}%")


def _test_dataset(data_dir: str | None) -> Dataset:
    images, labels = data.load_split(data_dir, "test")
    return data.make_dataset(images, labels, model.NBATCH_PHYSICAL, model.NBATCH_PHYSICAL)


def _physical_batch(nranks: int) -> int:
    """Images per micro-batch such that every rank gets whole micro-batches of each logical
    batch: ggml's 500 for 1 or 2 ranks, else the logical batch divided by ``nranks``."""
    if (model.NBATCH_LOGICAL // model.NBATCH_PHYSICAL) % nranks == 0:
        return model.NBATCH_PHYSICAL
    if model.NBATCH_LOGICAL % (nranks * 10) == 0:  # whole shards of 10 images
        return model.NBATCH_LOGICAL // nranks
    usable = [n for n in range(1, 101) if model.NBATCH_LOGICAL % (n * 10) == 0]
    raise ShapeError(f"--dist: {nranks} ranks cannot share a logical batch of "
                     f"{model.NBATCH_LOGICAL} images in whole shards of 10; use "
                     f"{', '.join(map(str, usable))} ranks")


def _train(args: argparse.Namespace) -> int:
    out = args.out or f"{_ARCHS[args.arch]}.gguf"
    training_cli.check_output_paths(
        [("--out", out), ("--checkpoint", args.checkpoint), ("--plot", args.plot)])
    if args.plot:
        require_matplotlib()  # fail before training, not after
    comm = world(args)
    nbatch = model.NBATCH_PHYSICAL if comm is None else _physical_batch(comm.size)
    if comm is not None and comm.rank != 0:
        return _train_rank(args, comm, nbatch)
    sched = _setup(args)
    arch = _ARCHS[args.arch]
    nepoch = args.epochs or (FULL_EPOCHS if args.data else SUBSET_EPOCHS)
    mnist = data.load_mnist(args.data)
    print(f"main: {len(mnist.train_images)} training and {len(mnist.test_images)} test images "
          f"from {mnist.source}", file=sys.stderr)
    ds_train = data.make_dataset(mnist.train_images, mnist.train_labels, 10,
                                 model.NBATCH_LOGICAL)
    ds_test = data.make_dataset(mnist.test_images, mnist.test_labels, nbatch, nbatch)

    m = model.build_model(arch, sched, nbatch)
    model.init_params(m, args.seed, args.init)
    history = _fit(args, m, ds_train, nepoch, comm)
    print(f"mnist_model_save: saving model to '{out}'")
    model.save_gguf(m, out)
    _print_result(_evaluate(m, ds_test))
    if args.plot:
        plot_history(history, args.plot, title=f"{arch}, {nepoch} epochs, {mnist.source}")
        print(f"main: wrote {args.plot}")
    return 0


def _train_rank(args: argparse.Namespace, comm: distributed.Communicator, nbatch: int) -> int:
    """What a rank other than 0 does in ``train``: its part of the training, silently."""
    sched = _setup(args)
    nepoch = args.epochs or (FULL_EPOCHS if args.data else SUBSET_EPOCHS)
    images, labels = data.load_split(args.data, "train")
    ds_train = data.make_dataset(images, labels, 10, model.NBATCH_LOGICAL, stream=io.StringIO())
    m = model.build_model(_ARCHS[args.arch], sched, nbatch)
    model.init_params(m, args.seed, args.init)
    _fit(args, m, ds_train, nepoch, comm)
    return 0


def _fit(args: argparse.Namespace, m: model.MnistModel, ds_train: Dataset, nepoch: int,
         comm: distributed.Communicator | None) -> FitHistory:
    """ggml's recipe with the schedule, checkpoint and resume options (every rank alike)."""
    _, idata_split = fit_split(ds_train.ndata, model.NBATCH_LOGICAL, m.nbatch_physical,
                               VAL_SPLIT)
    schedule = training_cli.make_schedule(args, nepoch, idata_split // model.NBATCH_LOGICAL)
    return model.train(m, ds_train, nepoch, val_split=VAL_SPLIT, comm=comm,
                       get_opt_pars=schedule, checkpoint=args.checkpoint,
                       resume=training_cli.resume_mode(args))


def _eval(args: argparse.Namespace) -> int:
    sched = _setup(args)
    print(f"mnist_model_init_from_file: loading model weights from '{args.model}'",
          file=sys.stderr)
    arch, weights = model.load_gguf(args.model)
    print(f"mnist_model_init_from_file: model arch is {arch}", file=sys.stderr)
    ds = _test_dataset(args.data)

    m = model.build_model(arch, sched)
    model.set_params(m, weights)
    iex = int(np.random.default_rng(args.seed).integers(ds.ndata))
    sys.stdout.write(data.image_ascii(ds.data.numpy()[iex]))
    result = _evaluate(m, ds)
    print(f"main: predicted digit is {result.pred()[iex]}")
    _print_result(result)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line tool with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.comm = None
    if args.command == "train":
        training_cli.check_training_args(parser, args)
    try:
        rc: int = args.func(args)
        return rc
    except BackendUnavailableError as exc:
        code, message = 2, f"mnist: device {args.device!r} unavailable: {exc}"
    except (GgoptError, OSError, ImportError) as exc:
        code, message = 1, f"mnist: error: {exc}"
    if args.comm is not None:  # the other ranks would wait for this one forever
        args.comm.abort(code, message)
    print(message, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
