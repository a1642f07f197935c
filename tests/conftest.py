"""Shared fixtures."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt


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
