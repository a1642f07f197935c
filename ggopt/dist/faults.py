"""Turn an uncaught exception on one rank into the end of the whole job, not a hang.

Without this, a rank that raises exits while the others wait forever in their next
collective. The hook prints the traceback and a line naming the failed rank, then calls
``MPI_Abort``: the launcher kills every rank and exits non-zero. A rank killed outright
(SIGKILL, out-of-memory killer) is the launcher's to handle: MPICH's and Open MPI's
``mpiexec`` kill the remaining ranks and exit non-zero (see ``docs/distributed.md``).
"""

from __future__ import annotations

import sys
import traceback
from types import TracebackType

from .comm import Communicator

__all__ = ["install_abort_on_error"]


def install_abort_on_error(comm: Communicator) -> None:
    """Make an uncaught exception in this process abort every rank of ``comm``'s job.

    Replaces ``sys.excepthook``; the previous hook is not called. Idempotent per process
    (a second call replaces the communicator).
    """

    def hook(
        exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            comm.abort(130, "interrupted; aborting all ranks")
        sys.stderr.write("".join(traceback.format_exception(exc_type, exc, tb)))
        comm.abort(
            1,
            f"failed with {exc_type.__name__}: {exc}; aborting all {comm.size} ranks (MPI_Abort)",
        )

    sys.excepthook = hook
