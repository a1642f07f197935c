"""Per-node compute times (what ggml's ``GGML_PERF`` counted): while a :class:`NodeTimes` is
active, the graphs the CPU backend compiles time each of their steps under the node or nodes it
computes (two for a fused product and add).

A plan compiled while the recorder was active keeps its timers and records into it for as long
as it stays active; afterwards those steps run as before, plus one check of a flag. Timings are
wall-clock seconds (``time.perf_counter``) around the step, on the thread that runs the graph.
"""

from __future__ import annotations

import dataclasses
import time
from types import TracebackType

from ..errors import StateError
from ..tensor import Tensor
from .base import Step

__all__ = ["NodeTimes", "StepTime", "timed"]


@dataclasses.dataclass
class StepTime:
    """One compiled step: the nodes it computes, its summed seconds and how often it ran."""

    nodes: tuple[Tensor, ...]
    seconds: float = 0.0
    calls: int = 0


class NodeTimes:
    """A context manager that records the steps of the graphs compiled inside it.

    ``steps`` lists every timed step; :meth:`clear` zeroes the times (to leave out warm-up
    steps) but keeps the steps.
    """

    _active: NodeTimes | None = None

    def __init__(self) -> None:
        self.steps: list[StepTime] = []
        self.recording = False

    def __enter__(self) -> NodeTimes:
        if NodeTimes._active is not None:
            raise StateError("NodeTimes: another recorder is active")
        NodeTimes._active = self
        self.recording = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        NodeTimes._active = None
        self.recording = False

    def clear(self) -> None:
        for s in self.steps:
            s.seconds, s.calls = 0.0, 0

    def total(self) -> float:
        """Seconds in all timed steps."""
        return sum(s.seconds for s in self.steps)


def timed(step: Step, nodes: tuple[Tensor, ...]) -> Step:
    """``step`` timed under ``nodes`` when a recorder is active, else ``step`` itself."""
    rec = NodeTimes._active
    if rec is None:
        return step
    entry = StepTime(nodes)
    rec.steps.append(entry)
    clock = time.perf_counter

    def run() -> None:
        if not rec.recording:
            step()
            return
        t0 = clock()
        step()
        entry.seconds += clock() - t0
        entry.calls += 1

    return run
