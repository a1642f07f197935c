"""The suite itself: every test function checks something.

A test passes when it asserts, expects an exception or warning (``pytest.raises``/``warns``),
or calls a helper that asserts: any function named ``assert*`` (``np.testing.assert_allclose``,
``helpers.assert_close``) or one on the short list below. A test that does none of these only
proves that its code ran without raising, and says nothing about the result.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.glob("tests/**/test_*.py"), *ROOT.glob("bench/bench_*.py")])

# Helpers that assert on their caller's behalf, by name (keep this list short and explicit).
ASSERTING_HELPERS = {
    "_unchanged",  # support/state.assert_unchanged: raises, and the full state is unchanged
    "check_grads",  # helpers: analytic gradients match finite differences
    "_compare",  # opt/test_torch_parity: loss and gradients match PyTorch's
    "check_op_case",  # support/backend_cases: an op on another backend equals the CPU's result
}
EXPECTING = {"raises", "warns", "deprecated_call"}


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def checks_something(fn: ast.FunctionDef) -> bool:
    """Whether ``fn`` asserts, expects an exception/warning or calls an asserting helper."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name in EXPECTING or name.startswith("assert") or name in ASSERTING_HELPERS:
                return True
    return False


def _test_functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            found += [f for f in node.body if isinstance(f, ast.FunctionDef)
                      and f.name.startswith("test")]
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            found.append(node)
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_test_function_checks_something(path):
    silent = [f.name for f in _test_functions(path) if not checks_something(f)]
    assert not silent, f"{path.name}: test functions that check nothing: {silent}"


def test_the_check_finds_silent_tests():
    tree = ast.parse(
        "def test_silent():\n    compute()\n"
        "def test_asserts():\n    assert compute() == 1\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        compute()\n"
        "def test_helper():\n    np.testing.assert_array_equal(compute(), 1)\n"
    )
    verdicts = {f.name: checks_something(f) for f in tree.body}
    assert verdicts == {"test_silent": False, "test_asserts": True, "test_raises": True,
                        "test_helper": True}
    assert len(FILES) > 30  # the glob found the suite


def _compare_tool():
    spec = importlib.util.spec_from_file_location(
        "compare_test_counts", ROOT / "tools" / "compare_test_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_count_comparison_finds_lost_cases():
    tool = _compare_tool()
    before = tool.count_cases("tests/test_a.py::test_x[1]\ntests/test_a.py::test_x[2]\n"
                              "tests/test_a.py::test_y\ntests/test_a.py::TestK::test_z\n"
                              "3 tests collected in 0.1s\n")
    assert before == {"test_x": 2, "test_y": 1, "TestK.test_z": 1}
    moved = tool.count_cases("tests/ops/test_b.py::test_x[1]\ntests/core/test_c.py::test_x[2]\n"
                             "      1 tests/ops/test_b.py::test_y\n"
                             "tests/ops/test_b.py::TestK::test_z\n")
    assert tool.compare(before, moved) == []
    fewer = tool.count_cases("tests/ops/test_b.py::test_x[1]\n")
    assert tool.compare(before, fewer) == ["TestK.test_z: 1 -> 0", "test_x: 2 -> 1",
                                           "test_y: 1 -> 0"]
