"""The MPI world: every process the launcher started, as a :class:`Communicator`."""

from __future__ import annotations

import os

from ..errors import BackendUnavailableError, InvalidValueError
from .comm import Communicator
from .faults import install_abort_on_error

__all__ = ["mpi_world"]


def mpi_world(
    *, check_every: int = 0, abort_on_error: bool = True, timeout: float | None = None
) -> Communicator:
    """A communicator over ``MPI.COMM_WORLD`` (initialising MPI on first use).

    Parameters
    ----------
    check_every : int
        See :class:`Communicator`.
    abort_on_error : bool
        Install :func:`install_abort_on_error`, so that an uncaught exception on one rank ends
        every rank instead of leaving them waiting (default True).
    timeout : float, optional
        Start :meth:`Communicator.start_watchdog` with this many seconds; default: the
        environment variable ``GGOPT_DIST_TIMEOUT`` if set, else no watchdog.

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
    if timeout is None and os.environ.get("GGOPT_DIST_TIMEOUT"):
        try:
            timeout = float(os.environ["GGOPT_DIST_TIMEOUT"])
        except ValueError:
            raise InvalidValueError(f"GGOPT_DIST_TIMEOUT must be a number of seconds, got "
                                    f"{os.environ['GGOPT_DIST_TIMEOUT']!r}") from None
    if timeout is not None and comm.size > 1:
        comm.start_watchdog(timeout)
    return comm
