"""The MPI world: every process the launcher started, as a :class:`Communicator`."""

from __future__ import annotations

from ..errors import BackendUnavailableError
from .comm import Communicator
from .faults import install_abort_on_error

__all__ = ["mpi_world"]


def mpi_world(*, check_every: int = 0, abort_on_error: bool = True) -> Communicator:
    """A communicator over ``MPI.COMM_WORLD`` (initialising MPI on first use).

    Parameters
    ----------
    check_every : int
        See :class:`Communicator`.
    abort_on_error : bool
        Install :func:`install_abort_on_error`, so that an uncaught exception on one rank ends
        every rank instead of leaving them waiting (default True).

    Raises
    ------
    BackendUnavailableError
        mpi4py (or the MPI library under it) cannot be loaded; the message says how to
        install it.
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py missing, or its MPI library failed to load
        raise BackendUnavailableError(
            f"MPI is not available ({exc}); install it with pip install 'ggopt[mpi]' "
            "(mpi4py and MPICH) or build mpi4py against your cluster's MPI"
        ) from exc
    comm = Communicator(MPI.COMM_WORLD, check_every=check_every)
    if abort_on_error and comm.size > 1:
        install_abort_on_error(comm)
    return comm
