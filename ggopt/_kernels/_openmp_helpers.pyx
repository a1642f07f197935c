"""What the build found about OpenMP (see ``ggopt._threads`` for the thread setting)."""

from ggopt._kernels._openmp cimport GGOPT_OPENMP_ENABLED, omp_get_max_threads


def openmp_enabled():
    """True when the kernels were compiled with OpenMP (``_OPENMP`` defined)."""
    return bool(GGOPT_OPENMP_ENABLED)


def omp_max_threads():
    """``omp_get_max_threads()``: the OpenMP runtime's default team size (1 without OpenMP)."""
    return omp_get_max_threads()
