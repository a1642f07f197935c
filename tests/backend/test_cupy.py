"""The CuPy backend.

Everywhere: importing ggopt never imports CuPy, and ``cupy_init`` raises
BackendUnavailableError without it. With CuPy and a CUDA device (tests marked ``gpu``): every
op of the op table of tests/support/backend_cases.py and whole training graphs on the GPU match
the CPU backend.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggopt import backend as gb
from ggopt.backend.cuda.backend import CuPyBackend
from ggopt.errors import BackendUnavailableError, DTypeError, InvalidValueError
from tests.support.backend_cases import (
    OP_CASES,
    _cnn,
    _cnn_arrays,
    _mlp,
    _mlp_arrays,
    check_op_case,
    forward_backward,
    train_adamw,
)

ROOT = Path(__file__).resolve().parents[2]

# GPU arithmetic (FMA contraction, cuBLAS and reduction orders, CUDA's expf/tanhf) differs
# from the CPU's in the last bits; semantic errors are orders of magnitude larger.
GPU_RTOL, GPU_ATOL = 1e-4, 1e-5


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_importing_ggopt_does_not_import_cupy():
    r = _python("import sys, ggopt, ggopt.backend, ggopt.opt\nprint('cupy' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_cupy_init_without_cupy_raises_backend_unavailable():
    r = _python(
        "import sys\n"
        "sys.modules['cupy'] = None  # what a machine without CuPy sees\n"
        "from ggopt import backend\n"
        "from ggopt.errors import BackendUnavailableError\n"
        "try:\n"
        "    backend.cupy_init()\n"
        "except BackendUnavailableError as exc:\n"
        "    print('raised:', exc)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("raised:")
    assert "CuPy is not available" in r.stdout and "cupy-cuda12x" in r.stdout


def test_bad_device_argument_raises_before_importing_cupy():
    with pytest.raises(DTypeError, match="device"):
        CuPyBackend("0")
    with pytest.raises(InvalidValueError, match="device"):
        CuPyBackend(-1)


@pytest.fixture(scope="module")
def gpu() -> CuPyBackend:
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install -e '.[gpu]')")
    try:
        return gb.cupy_init(0)
    except BackendUnavailableError as exc:
        pytest.skip(f"CuPy is installed but no CUDA device is usable: {exc}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.id)
def test_cupy_op_matches_cpu(gpu, case):
    check_op_case(gpu, case, rtol=GPU_RTOL, atol=GPU_ATOL)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_cupy_forward_backward_matches_cpu(gpu, model):
    fn, make = {"mlp": (_mlp, _mlp_arrays), "cnn": (_cnn, _cnn_arrays)}[model]
    arrays = make(np.random.default_rng(3))
    want, _ = forward_backward(None, fn, arrays)
    got, sched = forward_backward(gpu, fn, arrays)
    assert sched.get_n_copies() > 0
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=GPU_RTOL, atol=GPU_ATOL, err_msg=f"output {i}")


@pytest.mark.gpu
def test_cupy_adamw_training_matches_cpu(gpu):
    want_params, want_losses, _ = train_adamw(None)
    got_params, got_losses, (_, copies, labels_backend) = train_adamw(gpu)
    assert labels_backend is gpu and copies > 0
    np.testing.assert_allclose(got_losses, want_losses, rtol=GPU_RTOL)
    for g, w in zip(got_params, want_params):
        np.testing.assert_allclose(g, w, rtol=GPU_RTOL, atol=GPU_ATOL)
