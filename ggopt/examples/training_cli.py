"""Command-line options for long runs, shared by the training examples.

``--checkpoint FILE`` and ``--resume`` (``--resume-force``) map to :func:`ggopt.opt.fit`'s
``checkpoint`` and ``resume`` (``resume="force"``, see :func:`resume_mode`); ``--lr``,
``--lr-min``, ``--decay-epochs`` and ``--warmup`` pick a learning-rate schedule from
:mod:`ggopt.opt.schedule`:

- neither ``--decay-epochs`` nor ``--warmup``: a constant ``--lr``;
- ``--decay-epochs D``: llama.cpp finetune's ``max(lr_min, lr * 0.5**(epoch/D))``;
- ``--warmup N``: ``N`` optimizer steps of linear warm-up, then cosine decay to ``--lr-min``
  at the last step of the run.
"""

from __future__ import annotations

import argparse
from typing import Literal

from ..opt import OptimizerParams
from ..opt.schedule import Schedule, constant, epoch_decay, warmup_cosine

__all__ = ["add_training_args", "check_training_args", "make_schedule", "resume_mode",
           "DEFAULT_LR"]

DEFAULT_LR = 1e-3  # ggml's default AdamW and SGD alpha


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def add_training_args(p: argparse.ArgumentParser) -> None:
    """Add ``--checkpoint``, ``--resume``, ``--lr``, ``--lr-min``, ``--decay-epochs``,
    ``--warmup`` to a ``train`` sub-command's parser."""
    g = p.add_argument_group("checkpoints and learning-rate schedule")
    g.add_argument("--checkpoint", metavar="FILE",
                   help="save the whole training state (weights, optimizer moments, data "
                        "order, schedule) to FILE after every epoch (GGUF, written atomically)")
    g.add_argument("--resume", action="store_true",
                   help="continue the run saved in --checkpoint FILE after its last epoch; "
                        "the result is bit for bit that of an uninterrupted run; refused when "
                        "the checkpoint was saved by a different run (data, batch, split)")
    g.add_argument("--resume-force", action="store_true",
                   help="--resume even when the checkpoint was saved by a different run "
                        "(other text/data, batch or split): the result is no longer bit-exact")
    g.add_argument("--lr", type=_positive_float, default=DEFAULT_LR, metavar="LR",
                   help=f"learning rate (peak rate with a schedule; default {DEFAULT_LR:g})")
    g.add_argument("--lr-min", type=_nonnegative_float, metavar="LR",
                   help="floor of --decay-epochs / end point of the cosine after --warmup "
                        "(default 0)")
    g.add_argument("--decay-epochs", type=_positive_float, metavar="E",
                   help="halve the learning rate every E epochs (llama.cpp finetune's decay)")
    g.add_argument("--warmup", type=_nonnegative_int, metavar="STEPS",
                   help="linear warm-up over STEPS optimizer steps, then cosine decay to "
                        "--lr-min over the rest of the run")


def check_training_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error on contradictory options (``parser.error``)."""
    if (args.resume or args.resume_force) and not args.checkpoint:
        parser.error("--resume needs --checkpoint FILE")
    if args.decay_epochs is not None and args.warmup is not None:
        parser.error("--decay-epochs and --warmup are different schedules; pick one")
    if args.lr_min is not None:
        if args.decay_epochs is None and args.warmup is None:
            parser.error("--lr-min needs --decay-epochs or --warmup")
        if args.lr_min >= args.lr:
            parser.error(f"--lr-min ({args.lr_min:g}) must be below --lr ({args.lr:g})")


def resume_mode(args: argparse.Namespace) -> bool | Literal["force"]:
    """``fit``'s ``resume`` for ``--resume`` / ``--resume-force``."""
    return "force" if args.resume_force else bool(args.resume)


def make_schedule(args: argparse.Namespace, nepoch: int, steps_per_epoch: int,
                  base: OptimizerParams | None = None) -> Schedule:
    """The schedule the options describe, for a run of ``nepoch`` epochs of
    ``steps_per_epoch`` optimizer steps; ``base`` supplies the other hyperparameters."""
    lr_min = args.lr_min or 0.0
    if args.decay_epochs is not None:
        return epoch_decay(args.lr, args.decay_epochs, lr_min, base)
    if args.warmup is not None:
        return warmup_cosine(args.lr, nepoch * steps_per_epoch, args.warmup, lr_min, base)
    return constant(args.lr, base)
