"""Turn a failure on one rank into the end of the whole job, not a hang.

Without these, a rank that raises exits while the others wait forever in their next
collective. :func:`install_abort_on_error` prints the traceback and a line naming the failed
rank, then calls ``MPI_Abort``: the launcher kills every rank and exits non-zero. A rank killed
outright (SIGKILL, the out-of-memory killer) cannot react; MPICH's and Open MPI's ``mpiexec``
then kill the remaining ranks themselves. For launchers that do not, and for a rank that hangs,
:class:`Watchdog` aborts a rank that waits in one collective too long or sees a rank on its own
host die.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .comm import Communicator

__all__ = ["install_abort_on_error", "Watchdog"]


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


def _alive(pid: int) -> bool:
    """True unless process ``pid`` is gone or a zombie (Linux: read from /proc)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc: trust os.kill


class Watchdog:
    """A thread that aborts the job when this rank waits in one collective longer than
    ``timeout`` seconds, or when another rank on the same host dies while it waits.

    Made by :meth:`Communicator.start_watchdog` (collective: the ranks exchange pids).
    """

    def __init__(self, comm: Communicator, timeout: float) -> None:
        me = socket.gethostname()
        everyone = comm.allgather((os.getpid(), me))
        self._peers = [(r, pid) for r, (pid, host) in enumerate(everyone)
                       if host == me and r != comm.rank]
        self._comm = comm
        self.timeout = float(timeout)
        self._since: float | None = None
        self._what = ""
        self._poll = min(0.5, self.timeout / 4)
        threading.Thread(target=self._run, name="ggopt.distributed watchdog", daemon=True).start()

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Mark the time spent inside one collective call named ``what``."""
        self._what, self._since = what, time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def _run(self) -> None:
        while True:
            time.sleep(self._poll)
            since = self._since
            if since is None:
                continue
            dead = [r for r, pid in self._peers if not _alive(pid)]
            if dead:
                self._comm.abort(1, f"rank(s) {dead} died while this rank waited in "
                                    f"{self._what}; aborting all ranks (MPI_Abort)")
            waited = time.monotonic() - since
            if waited > self.timeout:
                self._comm.abort(1, f"waited {waited:.1f} s in {self._what} (timeout "
                                    f"{self.timeout:g} s): another rank is stuck or gone; "
                                    "aborting all ranks (MPI_Abort)")
