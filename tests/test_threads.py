"""The process-wide thread setting (ggopt._threads) and its effect on BLAS."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import threadpoolctl
from ggopt._kernels._openmp_helpers import omp_max_threads

from ggopt import _threads
from ggopt._kernels import _openmp_helpers
from ggopt.errors import DTypeError, InvalidValueError


@pytest.fixture(autouse=True)
def restore_default():
    yield
    _threads.set_n_threads(None)


def blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


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
    original = blas_threads()
    if not original:
        pytest.skip("threadpoolctl finds no BLAS library in this NumPy")
    _threads.set_n_threads(1)
    assert blas_threads() == [1] * len(original)
    _threads.set_n_threads(2)
    assert blas_threads() == [2] * len(original)
    _threads.set_n_threads(1)
    assert blas_threads() == [1] * len(original)
    _threads.set_n_threads(None)
    assert blas_threads() == original


def test_omp_num_threads_is_respected():
    code = "from ggopt import _threads; print(_threads.get_n_threads())"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize("policy,scaled", [("PASSIVE", True), ("passive", True), ("ACTIVE", False)])
def test_min_parallel_work_follows_the_wait_policy(monkeypatch, policy, scaled):
    monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    scale = _openmp_helpers.PASSIVE_WORK_SCALE if scaled else 1
    assert _openmp_helpers.min_parallel_work(1000) == 1000 * scale
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert _openmp_helpers.min_parallel_work(1000) == 1000
