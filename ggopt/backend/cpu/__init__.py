"""The CPU backend (ggml-cpu): its backend class, the node compilers (``ops/``), and the
process policies a CPU compute needs: the thread count (``threads``), BLAS held on one thread
during computes (``blas``), the subnormal flush (``denormals``) and how idle OpenMP threads wait
(``wait_policy``, imported first: it must run before any kernel module loads libgomp).
"""

from __future__ import annotations

# isort: off
from . import wait_policy  # noqa: F401  (first: sets the OpenMP wait policy)
from .backend import CPUBackend, cpu_init, host_backend
# isort: on

__all__ = ["CPUBackend", "cpu_init", "host_backend"]
