"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest

from ggopt._kernels import _ggml_order as go


@pytest.fixture(params=["vector", "portable"])
def path(request):
    """The ggml-order kernels as the AVX2 versions (skipped on a CPU without AVX2 and FMA),
    then forced lane by lane."""
    if request.param == "vector" and not go.vector():
        pytest.skip("the CPU has no AVX2 and FMA")
    go.force_portable(request.param == "portable")
    yield request.param
    go.force_portable(False)
