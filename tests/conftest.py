"""Fixtures shared by every layer of the suite (``n_threads``, ``rng``, ``ctx``) and the
hypothesis profiles of the property tests (tests/*/test_properties_*.py).

The suite is one package per layer (tests/ops, tests/kernels, tests/backend, ...; see
docs/architecture.md, "Tests"), so pytest imports each file by its dotted name
(``tests.ops.test_rope``) with the repository root on ``sys.path``; helpers that several test
modules share live in ``tests.support`` and no test module imports another.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ggopt

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the property tests skip themselves
    pass
else:
    # "ci" (the default): few, fixed examples, so the default run stays fast and repeatable.
    # "fuzz": release checks, thousands of random examples per property, e.g.
    # GGOPT_HYPOTHESIS_PROFILE=fuzz python -m pytest tests/*/test_properties_*.py
    _common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.data_too_large])
    settings.register_profile("ci", max_examples=25, derandomize=True, database=None,
                              **_common)
    settings.register_profile("fuzz", max_examples=3000, **_common)
    settings.load_profile(os.environ.get("GGOPT_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=[1, 2], ids=lambda n: f"{n}thr")
def n_threads(request):
    """Run the test with 1 and with 2 CPU threads; restore the default afterwards."""
    ggopt.set_n_threads(request.param)
    yield request.param
    ggopt.set_n_threads(None)


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with a fixed seed."""
    return np.random.default_rng(1234)


@pytest.fixture
def ctx() -> ggopt.Context:
    """A fresh context without memory (``no_alloc``), for tests of graph building and refusals."""
    return ggopt.Context()
