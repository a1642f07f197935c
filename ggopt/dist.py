"""The import path ``ggopt.dist`` that earlier READMEs documented (``ggopt.dist.mpi_world()``):
an alias of :mod:`ggopt.distributed`, the package's name since issue 20."""

from __future__ import annotations

from .distributed import (
    AllreduceStats,
    Communicator,
    install_abort_on_error,
    launched_by_mpi,
    mpi_world,
)

__all__ = ["Communicator", "AllreduceStats", "launched_by_mpi", "mpi_world",
           "install_abort_on_error"]
