"""ggopt.distributed without an MPI job: imports, launcher detection, argument errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ggopt
from ggopt import distributed as dist
from ggopt.backend import Scheduler, cpu_init
from ggopt.opt import LossType, OptContext, default_params

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_import_ggopt_never_imports_mpi4py():
    proc = _python(
        "import sys, ggopt, ggopt.opt, ggopt.distributed, ggopt.cli.mnist\n"
        "from ggopt.distributed import data_parallel, epoch\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mpi4py'))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_mpi_world_without_mpi4py_says_how_to_install():
    proc = _python(
        "import sys; sys.modules['mpi4py'] = None\n"
        "import ggopt.distributed\n"
        "try:\n"
        "    ggopt.distributed.mpi_world()\n"
        "except ggopt.BackendUnavailableError as exc:\n"
        "    print(exc)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'ggopt[mpi]'" in proc.stdout


@pytest.mark.parametrize("env, expected", [
    ({}, False),
    ({"PMI_SIZE": "1", "PMI_RANK": "0"}, False),
    ({"PMI_SIZE": "2", "PMI_RANK": "1"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, True),
    ({"PMI_SIZE": "x"}, False),
])
def test_launched_by_mpi_reads_the_launchers_environment(env, expected):
    assert dist.launched_by_mpi(env) is expected


def test_opt_params_comm_must_be_a_communicator():
    params = default_params(Scheduler([cpu_init()]), LossType.MEAN)
    params.comm = "COMM_WORLD"
    with pytest.raises(ggopt.DTypeError, match="ggopt.distributed.Communicator"):
        OptContext(params)


def test_plain_context_has_no_communicator():
    with OptContext(default_params(Scheduler([cpu_init()]), LossType.MEAN)) as opt_ctx:
        assert opt_ctx.comm is None
