"""What the command lines share: :func:`positive` (an argparse type) and :func:`world` (the
``--dist`` option's MPI set-up)."""

from __future__ import annotations

import argparse
import sys

from .. import distributed, get_n_threads, set_n_threads

__all__ = ["positive", "world"]


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def world(args: argparse.Namespace) -> distributed.Communicator | None:
    """The MPI world to train on (``args.dist``: auto, mpi or none), or None for a single
    process; on more than one rank it sets ``args.comm`` and, unless ``args.threads``,
    shares this machine's threads among its ranks."""
    if args.dist == "none" or (args.dist == "auto" and not distributed.launched_by_mpi()):
        return None
    comm = distributed.mpi_world()
    if comm.size == 1:
        return None
    args.comm = comm  # main() aborts every rank on an error
    local = comm.count_local_ranks()
    if args.threads is None:
        set_n_threads(max(1, get_n_threads() // local))
    where = comm.describe()
    if comm.rank == 0:
        print(f"main: data-parallel over MPI, {where}; threads per rank: {get_n_threads()}",
              file=sys.stderr)
    return comm
