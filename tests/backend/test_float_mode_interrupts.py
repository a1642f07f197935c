"""A KeyboardInterrupt anywhere in a compute leaves the caller's floating-point mode as it was.

CPython raises a signal handler's exception (Ctrl-C's KeyboardInterrupt) only between two
bytecodes of a Python function: at a function's start and after a call returns, among others.
The interrupter below raises KeyboardInterrupt deterministically at such points, one run per
point: at the start of every Python function called during the compute (``call`` events), and
at every single bytecode of the float mode's own Python code, wherever that code lives (the
module's file name ends in ``denormals.py``). After every interrupted run the calling thread,
the OpenMP team threads and NumPy must compute IEEE subnormals again. (The BLAS thread limit's
Python bookkeeping, ``backend/cpu/blas.py``, is left out: it is not the float mode.)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt._kernels import _elementwise as ew
from ggopt._kernels import _fpmode
from ggopt.backend.cpu.denormals import ComputeFloatMode

pytestmark = pytest.mark.skipif(not _fpmode.supported(),
                                reason="flush-to-zero is set on x86 only")

N_THREADS = 2
TINY = np.float32(1e-20)  # normal; its square, 1e-40, is subnormal


@pytest.fixture(autouse=True)
def _restore_float_mode():
    """Whatever a failing run leaves behind, the next test starts from IEEE arithmetic."""
    ggopt.set_flush_denormals(True)
    saved = _fpmode.set_this_thread(False)
    yield
    ggopt.set_flush_denormals(True)
    with ComputeFloatMode(8):  # leaving a scope clears the team threads' bits
        pass
    _fpmode.restore_this_thread(saved)


def _assert_ieee_everywhere() -> None:
    """The calling thread, NumPy on it, and the kernels' team threads keep subnormals."""
    assert not _fpmode.flushing(), "flush-to-zero left on in the calling thread"
    assert np.float32(1e-39) * np.float32(1) != 0, "NumPy flushes subnormals"
    a = np.full((1, 1, 256, 1024), TINY, np.float32)  # large enough for an OpenMP region
    out = np.empty_like(a)
    ew.binary(ew.BIN_MUL, a, a, out, N_THREADS)
    assert (out > 0).all(), "flush-to-zero left on in the OpenMP team threads"


def _in_float_mode_code(frame: FrameType) -> bool:
    return frame.f_code.co_filename.endswith("denormals.py")


def _in_blas_bookkeeping(frame: FrameType | None) -> bool:
    """Inside the BLAS thread limit's Python code (``backend/cpu/blas.py`` and what it calls):
    not the float mode's concern, and an interrupt there would leave its count of computes
    in flight off for the rest of the session, so no point is placed there."""
    while frame is not None:
        if frame.f_code.co_filename.endswith("blas.py"):
            return True
        frame = frame.f_back
    return False


class _Interrupter:
    """A trace function that raises KeyboardInterrupt at delivery point number ``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.seen = 0
        self.fired = False

    def _point(self) -> None:
        if self.seen == self.target:
            self.fired = True
            raise KeyboardInterrupt(f"injected at delivery point {self.target}")
        self.seen += 1

    def __call__(self, frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        if event != "call" or _in_blas_bookkeeping(frame):
            return None
        self._point()  # a function's start (RESUME): a real delivery point
        if _in_float_mode_code(frame):
            frame.f_trace_opcodes = True
            return self._local
        return None

    def _local(self, frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        if event == "opcode":
            self._point()
        return self._local


def _interrupt_everywhere(region: Callable[[], None]) -> int:
    """Run ``region`` once per delivery point, interrupted there, until a run passes every
    point; check the float mode after each run; return the number of runs interrupted.

    """
    region()  # first-use work (lazy imports, caches) out of the way
    target = 0
    while True:
        interrupter = _Interrupter(target)
        sys.settrace(interrupter)
        try:
            region()
        except KeyboardInterrupt:
            assert interrupter.fired
        finally:
            sys.settrace(None)
        _assert_ieee_everywhere()
        if not interrupter.fired:
            return target
        target += 1


def _body() -> None:
    x = np.full(4, TINY, np.float32)
    assert not (x * x).any()  # flushing inside the scope


def test_interrupt_at_every_point_of_a_compute_scope_restores_the_mode():
    def region() -> None:
        with ComputeFloatMode(N_THREADS):
            _body()

    points = _interrupt_everywhere(region)
    assert points >= 2  # at least region's and _body's starts


def test_interrupt_at_every_point_of_a_graph_compute_restores_the_mode():
    ctx = ggopt.Context(no_alloc=True)
    a = ctx.new_tensor(ggopt.F32, (1024, 256))
    ggopt.set_input(a)
    cctx = ggopt.Context(no_alloc=True)
    out = ggopt.mul(cctx, ggopt.scale(cctx, a, 1.0), a)
    ggopt.set_output(out)
    gf = ggopt.new_graph_custom(cctx, 64, False)
    ggopt.build_forward_expand(gf, out)
    cpu = gb.cpu_init(N_THREADS)
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(a, np.full((256, 1024), TINY, np.float32))
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)

    def region() -> None:
        sched.graph_compute(gf)

    points = _interrupt_everywhere(region)
    assert points >= 3
    sched.graph_compute(gf)  # the scheduler still computes, flushing
    assert not gb.tensor_get(out).any()
    _assert_ieee_everywhere()
