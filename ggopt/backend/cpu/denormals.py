"""The process-wide choice to flush subnormal floats to zero during graph computes.

A subnormal operand (below 1.18e-38 in magnitude) makes x86 FPUs take a slow path: OpenBLAS's
``sgemm`` and the vector loops then run many times slower. Attention's softmax produces such
values once training sharpens it (``exp`` of a score more than 87 below its row's maximum), and
they flow into the products of the backward pass. So, as TensorFlow does for its CPU kernels,
ggopt computes with flush-to-zero and denormals-are-zero set on every compute thread (on x86;
elsewhere nothing changes) and restores the threads' state afterwards. Every thread flushes
alike, so results stay the same for any thread count; they differ from IEEE arithmetic only
where a value would be subnormal. ``set_flush_denormals(False)`` keeps IEEE subnormals, as
ggml does.

:class:`ComputeFloatMode`, the scope of one compute, is written in C (``_kernels/_fpmode.pyx``)
so that no Python bytecode, and hence no KeyboardInterrupt, runs between setting the mode and
recording what to restore, or inside the restore.
"""

from __future__ import annotations

from ..._kernels._fpmode import ComputeFloatMode, enabled, set_enabled, supported
from ...errors import DTypeError

__all__ = ["ComputeFloatMode", "get_flush_denormals", "set_flush_denormals"]


def set_flush_denormals(on: bool) -> None:
    """Flush subnormal floats to zero in the graph computes that start from now on (the
    default), or keep IEEE subnormals (``False``, ggml's behaviour; slower when they occur)."""
    if not isinstance(on, bool):
        raise DTypeError(f"set_flush_denormals: expected a bool, got {type(on).__name__}")
    set_enabled(on)


def get_flush_denormals() -> bool:
    """Whether graph computes flush subnormals to zero (False where the CPU cannot: not x86)."""
    return bool(enabled()) and bool(supported())
