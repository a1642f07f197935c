"""Data-parallel training over MPI: one model trained by N processes (ranks).

Every rank holds the whole model. Each logical batch is split across the ranks; each rank
accumulates the gradients of its own micro-batches, the accumulators are summed across ranks
(one in-place all-reduce of one contiguous buffer) and every rank takes the same optimizer step.
See ``docs/distributed.md``.

``import ggopt`` and ``import ggopt.distributed`` never import mpi4py; :func:`mpi_world` does
(install it with ``pip install 'ggopt[mpi]'``).
"""

from __future__ import annotations

from .comm import AllreduceStats, Communicator, launched_by_mpi
from .faults import install_abort_on_error
from .world import mpi_world

__all__ = [
    "Communicator",
    "AllreduceStats",
    "launched_by_mpi",
    "mpi_world",
    "install_abort_on_error",
]
