"""What the build found about OpenMP, and how much work pays for a parallel region.

The thread setting itself lives in ``ggopt._threads``.
"""

import os
import re

from ggopt._kernels._openmp cimport GGOPT_OPENMP_ENABLED, omp_get_max_threads

# How much dearer a parallel region is when idle OpenMP threads sleep at once
# (OMP_WAIT_POLICY=PASSIVE, or GOMP_SPINCOUNT=0): waking them costs 20-100 us per region on the
# project's 2-core VMs, against about 2.5 us for a team that is still spinning.
PASSIVE_WORK_SCALE = 8


def openmp_enabled():
    """True when the kernels were compiled with OpenMP (``_OPENMP`` defined)."""
    return bool(GGOPT_OPENMP_ENABLED)


def omp_max_threads():
    """``omp_get_max_threads()``: the OpenMP runtime's default team size (1 without OpenMP)."""
    return omp_get_max_threads()


def idle_threads_sleep_at_once():
    """True when libgomp's idle threads do not spin: ``GOMP_SPINCOUNT`` is 0, or it is unset
    (or not a count libgomp reads) and ``OMP_WAIT_POLICY`` is PASSIVE. Read from the
    environment as libgomp read it when it loaded (``import ggopt`` sets a short spin)."""
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip().lower()
    if spin in ("infinite", "infinity"):
        return False
    m = re.fullmatch(r"(\d+)\s*[kmgt]?", spin)
    if m:
        return int(m.group(1)) == 0
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


def min_parallel_work(base):
    """The least work worth a parallel region, in the caller's units.

    ``base`` is the amount that takes about 5 us on one thread, which pays for waking a spinning
    team. When idle threads sleep at once (:func:`idle_threads_sleep_at_once`) the region costs
    more, so ``base`` is scaled by ``PASSIVE_WORK_SCALE``.
    """
    if idle_threads_sleep_at_once():
        return base * PASSIVE_WORK_SCALE
    return base
