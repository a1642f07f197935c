"""The communicator: the group of processes (ranks) that train one model together.

:class:`Communicator` wraps an mpi4py communicator with the few collectives data-parallel
training needs (an in-place float32 sum, a broadcast, an object all-gather), plus the two
checks that turn a disagreement between ranks into the same :class:`GgoptError` on every rank
instead of a deadlock. ``mpi4py`` is imported only when a communicator is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..errors import DTypeError, GgoptError, InvalidValueError, ShapeError, StateError

if TYPE_CHECKING:
    from .faults import Watchdog

__all__ = ["Communicator", "AllreduceStats", "launched_by_mpi"]

#: Environment variables through which MPI launchers tell a process its world size
#: (MPICH's Hydra, Intel MPI and Slurm's srun with PMI; Open MPI).
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """True when an MPI launcher (``mpiexec -n N`` with N > 1) started this process.

    Reads the launcher's environment variables only; mpi4py is not imported.
    """
    env = os.environ if environ is None else environ
    for name in _SIZE_VARIABLES:
        value = env.get(name, "")
        if value.isdigit() and int(value) > 1:
            return True
    return False


@dataclasses.dataclass
class AllreduceStats:
    """What the gradient all-reduces of a communicator cost so far.

    ``seconds`` includes the time spent waiting for the slowest rank to arrive.
    """

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


class Communicator:
    """A group of ranks training one model; wraps an mpi4py communicator.

    Parameters
    ----------
    mpi_comm : mpi4py.MPI.Comm
        E.g. ``MPI.COMM_WORLD`` (see :func:`ggopt.distributed.mpi_world`) or ``MPI.COMM_SELF``.
    check_every : int
        0 (default): no check. ``k > 0``: after every k-th optimizer step all ranks compare a
        digest of their parameters and optimizer state and raise :class:`StateError`
        everywhere if any rank's differs.

    Pass it as ``OptParams.comm`` or ``fit(..., comm=...)``. A communicator of size 1 is
    the same as none.
    """

    def __init__(self, mpi_comm: Any, *, check_every: int = 0) -> None:
        from mpi4py import MPI  # the optional dependency, imported only here

        if not isinstance(mpi_comm, MPI.Comm) or mpi_comm == MPI.COMM_NULL:
            raise DTypeError(
                f"mpi_comm must be an mpi4py communicator, got {type(mpi_comm).__name__}"
            )
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 0:
            raise InvalidValueError(f"check_every must be an int >= 0, got {check_every!r}")
        self._mpi = MPI
        self._comm = mpi_comm
        self.check_every = check_every
        self.stats = AllreduceStats()
        self._watchdog: Watchdog | None = None

    @property
    def rank(self) -> int:
        """This process's index, 0 .. size-1; rank 0 is the root (prints, writes files)."""
        return self._comm.Get_rank()

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._comm.Get_size()

    @property
    def mpi_comm(self) -> Any:
        """The wrapped mpi4py communicator."""
        return self._comm

    # --- collectives --------------------------------------------------------------------------
    def allreduce_sum_(self, buf: np.ndarray) -> None:
        """Replace the contiguous float32 array ``buf`` by its element-wise sum over ranks."""
        if buf.dtype != np.float32 or not buf.flags.c_contiguous:
            raise DTypeError("allreduce_sum_ needs a contiguous float32 array")
        t0 = time.perf_counter()
        with self._waiting("the gradient all-reduce"):
            self._comm.Allreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.bytes += buf.nbytes

    def bcast_(self, arr: np.ndarray, root: int = 0) -> None:
        """Overwrite the contiguous array ``arr`` with rank ``root``'s on every rank."""
        with self._waiting("a broadcast"):
            self._comm.Bcast(arr, root=root)

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        with self._waiting("an all-gather"):
            return self._comm.allgather(obj)

    def barrier(self) -> None:
        with self._waiting("a barrier"):
            self._comm.Barrier()

    def _waiting(self, what: str) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext() if self._watchdog is None else \
            self._watchdog.waiting(what)

    def start_watchdog(self, timeout: float) -> None:
        """Collective: abort the job when a rank waits in one collective longer than
        ``timeout`` seconds or sees a rank on its host die (:class:`.faults.Watchdog`).

        Pick ``timeout`` above the longest legitimate wait, e.g. rank 0 writing a checkpoint
        while the others wait at the next step.
        """
        if not timeout > 0:
            raise InvalidValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if self._watchdog is None:
            from .faults import Watchdog

            self._watchdog = Watchdog(self, timeout)
        self._watchdog.timeout = float(timeout)

    def count_local_ranks(self) -> int:
        """Collective: how many ranks share this rank's machine (to divide its cores)."""
        local = self._comm.Split_type(self._mpi.COMM_TYPE_SHARED)
        try:
            return local.Get_size()
        finally:
            local.Free()

    # --- agreement: the same error on every rank ----------------------------------------------
    def check_all(self, error: BaseException | None, fn: str) -> None:
        """Collective: raise on every rank when any rank passes an error.

        Each rank passes the :class:`GgoptError` its own checks raised (or None). The first
        failing rank's error type and message are re-raised everywhere, naming that rank.
        """
        reports = self.allgather(None if error is None else (type(error).__name__, str(error)))
        if error is not None:
            raise error
        for rank, report in enumerate(reports):
            if report is None:
                continue
            kind = {"ShapeError": ShapeError, "DTypeError": DTypeError}.get(report[0], StateError)
            raise kind(f"rank {rank} of {self.size} failed: {report[0]}: {report[1]} ({fn})")

    def run_all(self, fn: str, body: Callable[[], Any]) -> Any:
        """Run ``body()`` on every rank; a :class:`GgoptError` on any rank raises on all."""
        error, value = None, None
        try:
            value = body()
        except GgoptError as exc:
            error = exc
        self.check_all(error, fn)
        return value

    def agree(self, fn: str, what: str, values: Mapping[str, Any]) -> None:
        """Collective: raise :class:`ShapeError` on every rank unless all ``values`` match rank 0's.

        ``values`` maps names (``"ndata"``, ``"opt_period"``, ...) to comparable, picklable
        values; the message names the first differing name and rank.
        """
        everyone = self.allgather(dict(values))
        ref = everyone[0]
        for rank, theirs in enumerate(everyone[1:], start=1):
            for name in [*ref, *(n for n in theirs if n not in ref)]:
                if ref.get(name) != theirs.get(name):
                    raise ShapeError(
                        f"ranks disagree on {what}: {name} is {ref.get(name)!r} on rank 0 but "
                        f"{theirs.get(name)!r} on rank {rank} ({fn})"
                    )

    # --- faults -------------------------------------------------------------------------------
    def abort(self, code: int = 1, message: str | None = None) -> NoReturn:
        """Print ``message`` (prefixed with this rank) and end every rank of the job.

        ggml has no equivalent; this is ``MPI_Abort``: the launcher kills all ranks and exits
        non-zero.
        """
        if message:
            sys.stderr.write(f"ggopt.distributed: rank {self.rank} of {self.size}: {message}\n")
            sys.stderr.flush()
            time.sleep(0.2)  # let the launcher forward the message before it kills the job
        self._comm.Abort(code)
        raise SystemExit(code)  # not reached: Abort does not return

    def describe(self) -> str:
        """One line naming every rank's pid and host (collective), to match launcher messages
        such as MPICH's ``BAD TERMINATION ... PID <pid> RUNNING AT <host>`` to a rank."""
        who = self.allgather((os.getpid(), socket.gethostname()))
        return f"{self.size} ranks: " + ", ".join(
            f"rank {r} = pid {pid} on {host}" for r, (pid, host) in enumerate(who)
        )

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size})"
