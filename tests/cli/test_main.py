"""The ``ggopt`` command (``python -m ggopt``): its commands, ``--version``, ``--help`` of each,
the ``python -m ggopt.examples.*`` shims, and the one place the version is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ggopt
from ggopt.cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_version_is_printed_from_the_one_place_it_is_written():
    proc = _run("-m", "ggopt", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ggopt {ggopt.__version__}"
    from ggopt._version import __version__
    assert ggopt.__version__ is __version__


def test_pyproject_reads_the_version_and_installs_the_command():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "ggopt._version.__version__"}
    assert meta["project"]["scripts"] == {"ggopt": "ggopt.cli.main:main"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_help(command):
    proc = _run("-m", "ggopt", command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: ggopt {command} "), proc.stdout[:200]
    assert "--help" in proc.stdout


def test_top_level_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)


@pytest.mark.parametrize("argv, message", [([], "a command is required"),
                                           (["bogus"], "unknown command 'bogus'")])
def test_a_missing_or_unknown_command_is_a_usage_error(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ggopt") and f"ggopt: error: {message}" in err


def test_mnist_subcommand_help_and_its_usage_error():
    proc = _run("-m", "ggopt", "mnist", "train", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: ggopt mnist train ")
    proc = _run("-m", "ggopt", "mnist", "fit")
    assert proc.returncode == 2 and "invalid choice: 'fit'" in proc.stderr


@pytest.mark.parametrize("name", ["finetune", "llm", "mnist"])
def test_the_old_module_names_still_run(name):
    proc = _run("-m", f"ggopt.examples.{name}", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: ggopt")
