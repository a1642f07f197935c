"""Shared fixtures of the benchmark suite (``pytest bench``; never part of the default run)."""

from __future__ import annotations

import os

import pytest

try:  # before ggopt: PyTorch's OpenMP runtime reads the environment when torch loads, so the
    # PyTorch references run with the wait policy a PyTorch user's process has, not the short
    # spin count ``import ggopt`` sets (bench/README.md, "Threads")
    import torch  # noqa: F401
except ImportError:
    pass

import ggopt  # noqa: E402

# (median, min) in seconds of the benchmarks run so far, by (group, id), for same-run ratios.
_TIMES: dict[tuple[str, str], tuple[float, float]] = {}


@pytest.fixture(scope="module")
def bench_threads():
    """Run the module's benchmarks on ``GGOPT_BENCH_THREADS`` threads (default 2).

    ``ggopt.set_n_threads`` limits the OpenMP kernels and NumPy's BLAS alike; the default
    setting is restored afterwards.
    """
    n = int(os.environ.get("GGOPT_BENCH_THREADS", "2"))
    ggopt.set_n_threads(n)
    yield n
    ggopt.set_n_threads(None)


@pytest.fixture
def ratio_to(benchmark):
    """``ratio_to(name, ref=bound, ...)``, called after ``benchmark(...)``.

    Remembers this row's median and min under ``(group, name)``. For every reference ``ref``
    measured earlier in the same group it stores ``ratio_vs_<ref> = median(ref) / median(this)``
    (above 1: this row is faster), the same ratio of the minima (``min_ratio_vs_<ref>``, less
    sensitive to a busy machine) and, when ``bound`` is not None, the target ``target_vs_<ref>``
    and whether the median ratio reaches it (``met_vs_<ref>``) in ``benchmark.extra_info``.
    Returns the median ratios; empty under ``--benchmark-disable``.
    """

    def record(name: str, **refs: float | None) -> dict[str, float]:
        if benchmark.stats is None:
            return {}
        median, fastest = benchmark.stats.stats.median, benchmark.stats.stats.min
        _TIMES[(benchmark.group, name)] = (median, fastest)
        ratios = {}
        for ref, bound in refs.items():
            if (benchmark.group, ref) not in _TIMES or ref == name:
                continue
            ref_median, ref_fastest = _TIMES[(benchmark.group, ref)]
            ratios[ref] = ref_median / median
            benchmark.extra_info[f"ratio_vs_{ref}"] = round(ratios[ref], 3)
            benchmark.extra_info[f"min_ratio_vs_{ref}"] = round(ref_fastest / fastest, 3)
            if bound is not None:
                benchmark.extra_info[f"target_vs_{ref}"] = bound
                benchmark.extra_info[f"met_vs_{ref}"] = bool(ratios[ref] >= bound)
        return ratios

    return record
