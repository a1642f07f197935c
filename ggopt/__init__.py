"""ggopt: ggml's training API (ggml-opt) as a Python library.

Graphs are built with ggml's names and argument order (``ggopt.add(ctx, a, b)``), computed by
Cython + OpenMP kernels on the CPU (or CuPy on a GPU), and trained with :mod:`ggopt.opt`.
"""

from __future__ import annotations

# First, before any kernel module loads libgomp: importing the CPU backend's wait_policy sets
# how idle OpenMP threads wait (a short spin, or sleeping when several MPI ranks share this
# machine; the user's own OMP_WAIT_POLICY / GOMP_SPINCOUNT wins).
# isort: off
from .backend.cpu import wait_policy as _wait_policy  # noqa: F401
# isort: on
from . import errors  # noqa: E402
from .backend.cpu.denormals import get_flush_denormals, set_flush_denormals  # noqa: E402
from .backend.cpu.threads import get_n_threads, openmp_enabled, set_n_threads  # noqa: E402
from .context import Context  # noqa: E402
from .errors import (
    BackendUnavailableError,
    DTypeError,
    GgoptError,
    InvalidValueError,
    OutOfMemoryError,
    ShapeError,
    StateError,
)
from .graph import (
    GRAPH_DEFAULT_SIZE,
    Graph,
    build_backward_expand,
    build_forward_expand,
    graph_dup,
    graph_get_grad,
    graph_get_grad_acc,
    graph_reset,
    new_graph,
    new_graph_custom,
)
from .ops import *  # noqa: F401,F403 - the op constructors, ggml names
from .ops import __all__ as _ops_all
from .tensor import Op, Tensor, UnaryOp
from .types import BF16, F16, F32, I32, I64, GGType, TensorFlag

__version__ = "0.1.0"

__all__ = [
    "__version__", "errors", "backend", "distributed", "io", "opt", "get_n_threads",
    "set_n_threads", "openmp_enabled", "get_flush_denormals", "set_flush_denormals", "Context",
    "GgoptError",
    "ShapeError", "InvalidValueError", "DTypeError",
    "StateError", "BackendUnavailableError",
    "OutOfMemoryError", "Graph", "GRAPH_DEFAULT_SIZE", "new_graph", "new_graph_custom",
    "build_forward_expand", "graph_dup", "build_backward_expand", "graph_reset", "graph_get_grad",
    "graph_get_grad_acc", "Op", "UnaryOp", "Tensor", "GGType", "TensorFlag", "F32", "F16", "BF16",
    "I32",
    "I64", *[n for n in _ops_all if n not in ("GradSink", "BACKWARD")],
]

# The sub-packages (CuPy is imported only by ggopt.backend.cupy_init and mpi4py only by
# ggopt.distributed.mpi_world, never here). Importing the backend also installs the host
# allocator of Context(no_alloc=False). ggopt.dist is the alias of ggopt.distributed.
# isort: off
from . import backend, dist, distributed, io, opt  # noqa: E402, F401
# isort: on
