"""How idle OpenMP threads wait: chosen by ``import ggopt`` before any kernel loads libgomp.

libgomp reads ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, when it loads. Unless the user set
one of them, ggopt sets a short spin (about 1 ms, then sleep): waking a sleeping thread costs
60-100 µs per parallel region on a VM (more when the host is busy), and a training step's small
kernels and Python leave gaps of 0.3-1 ms between its parallel products; libgomp's own default
spin (10x longer) holds a core for several ms after every compute, which NumPy's BLAS or
another process may need. When a launcher started several processes of one job on this
machine (MPI ranks: ``MPI_LOCALNRANKS``, ``OMPI_COMM_WORLD_LOCAL_SIZE``), their threads share
the cores, and a spinning thread would hold one that another rank needs (2 ranks x 2 threads
on 2 cores: an MNIST-FC epoch took 0.77 s spinning, 0.39 s with PASSIVE): idle threads then
sleep at once. Importing this module makes the choice for the running process (``import
ggopt`` imports it first).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

__all__ = ["SPIN_COUNT", "choose_wait_policy", "local_processes"]

#: Spins of an idle libgomp thread before it sleeps (about 1 ms on an AMD Zen 3: 10,000 spins
#: slept between gaps of 0.2 and 0.5 ms, 30,000 between 0.7 and 1 ms).
SPIN_COUNT = 30000

#: Variables through which launchers tell a process how many processes of its job share this
#: machine (MPICH's Hydra and Intel MPI; Open MPI).
_LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def local_processes(environ: Mapping[str, str]) -> int:
    """How many processes of this job run on this machine, by the launcher's word (1 if none)."""
    for name in _LOCAL_SIZE_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def choose_wait_policy(environ: MutableMapping[str, str]) -> None:
    """Set libgomp's wait in ``environ`` unless the user chose one: a short spin, or PASSIVE
    when several processes of one job share this machine."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return
    if local_processes(environ) > 1:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)


choose_wait_policy(os.environ)
