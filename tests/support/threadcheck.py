"""Proof that a computation really ran on a second OS thread, and sizes that make it do so.

A kernel decides between its serial path and an OpenMP region from two facts only: more than
one thread was asked for, and the work reaches its threshold (``min_parallel_work``, scaled
up when idle OpenMP threads sleep at once, e.g. ``OMP_WAIT_POLICY=PASSIVE``; each kernel
module reads the environment once, when it loads). So "does this call go parallel?" has the
same answer for 2 threads and for any larger count, and a larger count makes the answer
visible:

libgomp keeps the workers of its last team parked in a pool and creates threads only when a
team needs more workers than the pool holds. The pool never holds more workers than the largest
team started so far, so a call given a larger ``n`` (:func:`fresh_team_size`) must create at
least one new OS thread (visible at once in ``/proc/self/task``) if it starts a team, and
creates none if it stays serial. :func:`threads_started` runs a call that way and returns the
number of new threads.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable

import pytest
from ggopt._kernels._openmp_helpers import min_parallel_work, omp_max_threads

import ggopt

#: The element count above which every element-wise, reduction and softmax kernel starts a
#: team, under the wait policy in effect (the kernels' largest base is 1 << 15 work units; an
#: element costs at least one). Read in this process, whose environment the kernels saw when
#: they loaded: tests that change the wait policy restore it.
PARALLEL_ELEMENTS = min_parallel_work(1 << 15)


def large_2d(rows: int = 257) -> tuple[int, int]:
    """A NumPy shape ``(rows, odd columns)`` with 25 % more elements than
    :data:`PARALLEL_ELEMENTS`: above every kernel's threshold, with odd sizes."""
    cols = math.ceil(1.25 * PARALLEL_ELEMENTS / rows) | 1
    return rows, cols


def os_thread_ids() -> set[str]:
    """The ids of this process's OS threads.

    Tests compare these sets, not counts: a thread an earlier test left behind (a worker pool
    winding down) may exit during the call being watched, and a count would then hide a thread
    the call started."""
    return set(os.listdir("/proc/self/task"))


def skip_unless_observable() -> None:
    """Skip where threads cannot be counted (not Linux) or never start (no OpenMP)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("counting OS threads needs /proc/self/task (Linux)")
    if not ggopt.openmp_enabled():
        pytest.skip("the kernels were built without OpenMP: they never start a thread")


#: The tests start OpenMP teams of ggopt's thread count, of a few threads chosen by hand (fewer
#: than this), or of the sizes :func:`fresh_team_size` hands out.
_HAND_PICKED_TEAMS = 16
_largest_fresh_team = 0


def fresh_team_size() -> int:
    """A thread count larger than any OpenMP team this process can have parked: one more than
    every team size the tests use (see :data:`_HAND_PICKED_TEAMS`) and than every size handed
    out before.

    It used to be one more than the process's OS threads, which grow by every BLAS worker (two
    OpenBLAS pools once SciPy's is loaded) at each call, until the size passed the kernels'
    thread limit in a long test run.
    """
    global _largest_fresh_team
    _largest_fresh_team = max(_largest_fresh_team, _HAND_PICKED_TEAMS, omp_max_threads(),
                              ggopt.get_n_threads()) + 1
    return _largest_fresh_team


def threads_started(call: Callable[[int], object]) -> int:
    """Run ``call(n)`` with ``n`` = :func:`fresh_team_size` and return how many OS threads it
    created: at least 1 when it ran an OpenMP region, 0 when it stayed on the calling thread.

    ``call`` must take the thread count as its argument and must not start threads of its own
    (no matrix products: those run on a Python thread pool). Anything ``call`` has to set up
    that could start threads (``ggopt.set_n_threads`` resizes BLAS's pool) goes before the
    count: pass a ``call`` that only computes, or use :func:`count_new_threads`.
    """
    skip_unless_observable()
    n = fresh_team_size()
    before = os_thread_ids()
    call(n)
    return len(os_thread_ids() - before)


def count_new_threads(run: Callable[[], object]) -> int:
    """How many OS threads ``run()`` created (for set-up done by the caller beforehand)."""
    skip_unless_observable()
    before = os_thread_ids()
    run()
    return len(os_thread_ids() - before)
