"""BLAS on one thread while graphs compute: an object each scheduler owns.

OpenBLAS sums a product's K dimension differently depending on its thread count and on how the
output is partitioned. ggopt therefore runs every product of a graph compute with BLAS on one
thread, over slices whose bounds depend only on the shapes, spread over its own worker threads
(``cpu_ops/linalg.py``): the results are the same bits for any thread count. Outside computes
BLAS follows :func:`ggopt.set_n_threads`.

The BLAS libraries' thread count is process state, so every :class:`SerialBlas` shares one
count of the computes in flight, under a lock: the first compute in sets one thread, the last
one out restores what was there. Two schedulers computing on two Python threads therefore never
undo each other's setting.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, ClassVar

from .. import _threads

__all__ = ["SerialBlas"]


class SerialBlas:
    """A context manager that holds BLAS on one thread while at least one compute runs."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _active: ClassVar[int] = 0
    _saved: ClassVar[list[int]] = []
    _libs: ClassVar[list[Any] | None] = None  # threadpoolctl controllers of the BLAS libraries

    @classmethod
    def _controllers(cls) -> list[Any]:
        if cls._libs is None:
            cls._libs = [c for c in _threads.threadpool_controller().lib_controllers
                         if c.user_api == "blas"]
        return cls._libs

    def __enter__(self) -> SerialBlas:
        cls = type(self)
        with cls._lock:
            if cls._active == 0:
                libs = cls._controllers()
                cls._saved = [c.num_threads for c in libs]
                for c, n in zip(libs, cls._saved):
                    if n != 1:
                        c.set_num_threads(1)
            cls._active += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        cls = type(self)
        with cls._lock:
            cls._active -= 1
            if cls._active == 0:
                for c, n in zip(cls._controllers(), cls._saved):
                    if n != 1:
                        c.set_num_threads(n)
