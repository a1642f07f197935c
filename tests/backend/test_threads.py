"""The process-wide thread setting (ggopt.backend.cpu.threads) and its effect on BLAS."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import threadpoolctl
from ggopt._kernels._openmp_helpers import omp_max_threads

import ggopt
from ggopt import (
    DTypeError,
    InvalidValueError,
)
from ggopt import backend as gb
from ggopt._kernels import _openmp_helpers
from ggopt.backend.cpu import threads as _threads


@pytest.fixture(autouse=True)
def restore_default():
    yield
    _threads.set_n_threads(None)


def blas_threads() -> list[int]:
    """The threaded BLAS libraries' counts (not oneMKL's sequential layer: one thread always)."""
    return [i["num_threads"] for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas" and i.get("threading_layer") != "sequential"]


def test_default_is_cpu_count_capped_by_openmp():
    n = _threads.get_n_threads()
    assert n >= 1
    if not _threads.openmp_enabled():
        assert n == 1
    elif not os.environ.get("OMP_NUM_THREADS"):
        assert n == min(os.cpu_count() or 1, omp_max_threads())


@pytest.mark.parametrize("n", [1, 2, 3, np.int64(2)])
def test_set_and_get(n):
    _threads.set_n_threads(n)
    got = _threads.get_n_threads()
    assert type(got) is int
    assert got == (int(n) if _threads.openmp_enabled() else 1)


def test_none_restores_the_default():
    default = _threads.get_n_threads()
    _threads.set_n_threads(1 if default > 1 else 2)
    _threads.set_n_threads(None)
    assert _threads.get_n_threads() == default


@pytest.mark.parametrize("bad", [0, -1, -8])
def test_non_positive_raises_invalid_value_error(bad):
    before = _threads.get_n_threads()
    with pytest.raises(InvalidValueError, match="positive") as info:
        _threads.set_n_threads(bad)
    assert isinstance(info.value, ValueError)
    assert _threads.get_n_threads() == before


@pytest.mark.parametrize("bad", [1.0, "2", True, [2]])
def test_non_integer_raises_dtype_error(bad):
    with pytest.raises(DTypeError, match="int") as info:
        _threads.set_n_threads(bad)
    assert isinstance(info.value, TypeError)


def test_blas_follows_the_setting():
    _threads.threadpool_controller()  # loads SciPy's BLAS (the products' BLAS) first
    original = blas_threads()
    if not original:
        pytest.skip("threadpoolctl finds no BLAS library in this NumPy")
    _threads.set_n_threads(1)
    assert blas_threads() == [1] * len(original)
    _threads.set_n_threads(2)
    assert blas_threads() == [min(2, os.cpu_count() or 1)] * len(original)
    _threads.set_n_threads(1)
    assert blas_threads() == [1] * len(original)
    _threads.set_n_threads(None)
    assert blas_threads() == original


def test_blas_never_gets_more_threads_than_cpus():
    """A huge setting reaches the kernels, but BLAS (which starts its threads at once) stays at
    one thread per CPU."""
    _threads.threadpool_controller()
    try:
        _threads.set_n_threads(_threads.MAX_N_THREADS)
        assert _threads.get_n_threads() in (_threads.MAX_N_THREADS, 1)  # 1: no OpenMP
        assert all(n <= (os.cpu_count() or 1) for n in blas_threads())
    finally:
        _threads.set_n_threads(None)


def test_omp_num_threads_is_respected():
    code = "import ggopt; print(ggopt.get_n_threads())"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"


_PROBE = """
import os, sys
import numpy as np
import ggopt
from ggopt._kernels import _elementwise as E

def started(n_elements):  # OS threads that one 2-thread relu over n_elements creates
    a = np.ones(n_elements, np.float32).reshape(1, 1, 1, -1)
    before = len(os.listdir("/proc/self/task"))
    E.unary(E.UN_RELU, a, np.empty_like(a), 2)
    return len(os.listdir("/proc/self/task")) - before

print(os.environ.get("GOMP_SPINCOUNT", "-"), *(started(int(n)) for n in sys.argv[1:]))
"""


@pytest.mark.parametrize("policy,spin,local,scaled,got_spin", [
    ("PASSIVE", None, None, True, "-"), ("passive", None, None, True, "-"),
    ("ACTIVE", None, None, False, "-"), (None, "0", None, True, "0"),
    ("PASSIVE", "5k", None, False, "5k"), (None, None, None, False, "30000"),
    (None, None, "2", True, "-"), (None, None, "1", False, "30000"),
    ("ACTIVE", None, "2", False, "-"),
])
def test_thresholds_in_effect_follow_the_wait_policy(policy, spin, local, scaled, got_spin):
    """In a fresh process (an empty OpenMP pool, thresholds read when the kernels load), a relu
    of ``threshold - 1`` elements stays on one thread and one of ``threshold`` elements starts
    exactly one more; the threshold is 8x higher when idle threads sleep at once (PASSIVE
    without a spin count, or GOMP_SPINCOUNT=0). With neither variable set, ``import ggopt``
    sets a short spin (GOMP_SPINCOUNT=30000), or PASSIVE when the launcher says that several
    processes of the job share the machine (``local``: MPI_LOCALNRANKS)."""
    if not sys.platform.startswith("linux") or not _threads.openmp_enabled():
        pytest.skip("needs /proc/self/task and an OpenMP build")
    base = 1 << 15  # the element-wise kernels' base amount of work; relu counts 1 per element
    scale = _openmp_helpers.PASSIVE_WORK_SCALE if scaled else 1
    threshold = base * scale
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS",
                        "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")}
    for name, value in (("OMP_WAIT_POLICY", policy), ("GOMP_SPINCOUNT", spin),
                        ("MPI_LOCALNRANKS", local)):
        if value is not None:
            env[name] = value
    sizes = [base, threshold - 1, threshold] if scaled else [threshold - 1, threshold]
    out = subprocess.run([sys.executable, "-c", _PROBE, *map(str, sizes)], env=env,
                         capture_output=True, text=True, check=True)
    printed_spin, *started = out.stdout.split()
    assert printed_spin == got_spin
    assert [int(s) for s in started] == [0] * (len(sizes) - 1) + [1]


@pytest.mark.parametrize("n", [1000, 100_000, 2**31])
def test_absurd_thread_counts_are_refused(n):
    before = ggopt.get_n_threads()
    with pytest.raises(InvalidValueError, match="at most"):
        ggopt.set_n_threads(n)
    assert ggopt.get_n_threads() == before
    with pytest.raises(InvalidValueError, match="at most"):
        gb.cpu_init(n)
    with pytest.raises(InvalidValueError, match="at most"):
        gb.cpu_init().set_n_threads(n)


def test_thread_count_limit_is_at_least_the_cpu_count():
    # MAX_N_THREADS itself is used in a child process (tests/test_no_crash_subprocess.py): here
    # it would leave that many BLAS and OpenMP threads parked in the test process
    from ggopt.backend.cpu.threads import MAX_N_THREADS

    assert MAX_N_THREADS >= max(512, os.cpu_count() or 1)
    with pytest.raises(InvalidValueError, match=f"at most {MAX_N_THREADS}"):
        ggopt.set_n_threads(MAX_N_THREADS + 1)
