"""Starting MPI jobs from tests: the launcher, the environment of the ranks, and the worker
script (tests/support/dist_worker.py) with its scenarios."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository root


WORKER = str(Path(__file__).resolve().parent / "dist_worker.py")


TIMEOUT_S = 120  # generous for a loaded machine; a fault must end the job long before


def _find_mpiexec() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return None
    beside = Path(sys.prefix) / "bin" / "mpiexec"  # the mpich wheel installs it here
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = _find_mpiexec()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def run(nranks: int, *args: str, **env: str) -> tuple[int, str]:
    """Run ``args`` (a Python command line) on ``nranks`` ranks; return (exit code, output).

    ``nranks=1`` runs one plain process, no launcher. The job runs in its own process group,
    killed whole if it outlives :data:`TIMEOUT_S`.
    """
    cmd = [sys.executable, *args]
    if nranks > 1:
        cmd = [MPIEXEC, "-n", str(nranks), *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the MPI job hung (killed after {TIMEOUT_S} s):\n{out}")
    return proc.returncode, out


def worker(nranks: int, *args: str, **env: str) -> tuple[int, str]:
    return run(nranks, WORKER, *args, **env)


def errors(outdir: Path, rank: int) -> str:
    """The GgoptError that ``rank`` of a worker job caught ('' if none)."""
    path = outdir / f"error.{rank}"
    return path.read_text() if path.exists() else ""


def max_rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |a| (relative to the tensor's scale, not element by element)."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(a)))


#: skip where MPI is not installed
needs_mpi = pytest.mark.skipif(
    MPIEXEC is None,
    reason="MPI is not installed: pip install 'ggopt[mpi]' (mpi4py and MPICH's mpiexec)",
)
