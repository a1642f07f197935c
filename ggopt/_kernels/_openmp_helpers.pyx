"""What the build found about OpenMP, and how much work pays for a parallel region.

The thread setting itself lives in ``ggopt._threads``.
"""

import os

from ggopt._kernels._openmp cimport GGOPT_OPENMP_ENABLED, omp_get_max_threads

# How much dearer a parallel region is when idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE):
# waking them costs about 20 us per region on the project's 2-core VMs, against about 2.5 us
# for a team that is still spinning.
PASSIVE_WORK_SCALE = 8


def openmp_enabled():
    """True when the kernels were compiled with OpenMP (``_OPENMP`` defined)."""
    return bool(GGOPT_OPENMP_ENABLED)


def omp_max_threads():
    """``omp_get_max_threads()``: the OpenMP runtime's default team size (1 without OpenMP)."""
    return omp_get_max_threads()


def min_parallel_work(base):
    """The least work worth a parallel region, in the caller's units.

    ``base`` is the amount that takes about 5 us on one thread, which pays for waking a spinning
    team. When idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``, read here as libgomp read it when
    it loaded) the region costs more, so ``base`` is scaled by ``PASSIVE_WORK_SCALE``.
    """
    if os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE":
        return base * PASSIVE_WORK_SCALE
    return base
