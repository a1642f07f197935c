"""The build: every kernel source is compiled, and OpenMP is on.

A build without OpenMP is allowed (the kernels then run serially); set GGOPT_SKIP_OPENMP_TEST
to accept one here.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

import ggopt._kernels
from ggopt._kernels import _openmp_helpers

KERNEL_DIR = Path(ggopt._kernels.__path__[0])


@pytest.mark.parametrize("source", sorted(p.stem for p in KERNEL_DIR.glob("*.pyx")))
def test_every_kernel_source_is_built(source):
    module = importlib.import_module(f"ggopt._kernels.{source}")
    assert Path(module.__file__).suffix in (".so", ".pyd")


@pytest.mark.skipif(
    bool(os.environ.get("GGOPT_SKIP_OPENMP_TEST")), reason="GGOPT_SKIP_OPENMP_TEST is set"
)
def test_openmp_parallelism_enabled():
    assert _openmp_helpers.openmp_enabled(), (
        "ggopt was built without OpenMP, so every kernel runs on one thread. Install a compiler "
        "with OpenMP (gcc, or clang with libomp), or set GGOPT_SKIP_OPENMP_TEST=1 to accept a "
        "serial build."
    )
    assert _openmp_helpers.omp_max_threads() >= 1
