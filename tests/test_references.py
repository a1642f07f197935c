"""Every repository path and every ``ggopt.`` dotted name that a comment, a docstring or a doc
page mentions exists: a moved file or a renamed function leaves no pointer behind."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "ggopt"
#: where a relative path may start: the repository, the package, the tests, the backends
ROOTS = (REPO, PKG, REPO / "tests", PKG / "backend")
FIRST = {p.name for r in ROOTS for p in r.iterdir()} - {"__pycache__", "README.md"}
PATH = re.compile(r"(?<![\w./<>*-])((?:\.ci|[A-Za-z_][\w-]*)/[\w./-]*[\w/])([<*{]?)")
NAME = re.compile(r"(?<![\w.])ggopt(?:\.[A-Za-z_]\w*)+")
#: a path within this many characters after these words is ggml's or llama.cpp's
EXTERNAL = re.compile(r"ggml|llama\.cpp|llama-cpp")
#: describes ggml's repository, not this one (its paths are ggml's)
GGML_PAGES = {"docs/ggml-opt-spec.md"}


def _files() -> list[Path]:
    out = [*PKG.rglob("*.py"), *PKG.rglob("*.pyx"), *PKG.rglob("*.pxd"), *PKG.rglob("*.h"),
           *(REPO / "tests").rglob("*.py"), *(REPO / "bench").glob("*.py"),
           *(REPO / "tools").glob("*.py"), *(REPO / "docs").glob("*.md"),
           *(REPO / "bench").glob("*.md")]
    # CHANGELOG.md names what was removed: not a pointer
    out += [REPO / n for n in ("README.md", "CONTRIBUTING.md")]
    return sorted(out)


def _texts(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of the prose in ``path``: a page whole; a Python module's docstrings
    and comments; a C or Cython file's comments."""
    src = path.read_text()
    if path.suffix == ".md":
        return [(1, src)]
    out = []
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    out.append((node.body[0].lineno, doc))
        out += [(t.start[0], t.string) for t in
                tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT]
    else:
        for i, line in enumerate(src.splitlines(), 1):
            m = re.search(r"(#|//|/\*|\*).*", line)
            if m:
                out.append((i, m.group(0)))
    return out


def _path_exists(path: str, glob: bool) -> bool:
    """``path`` (``dir/``, ``module.py``, ``module.name``, a prefix followed by a pattern) is
    under one of the roots; paths that start elsewhere are not this repository's."""
    path = path.rstrip("/.")
    if path.split("/")[0] not in FIRST:
        return True
    candidates = (path, path + ".py", re.sub(r"\.\w+$", "", path) + ".py")
    return any((glob and any(r.glob(path + "*"))) or any((r / c).exists() for c in candidates)
               for r in ROOTS)


@cache
def _key_prefixes() -> frozenset[str]:
    """The ``ggopt.``-prefixed strings of the package's code (GGUF keys such as
    ``ggopt.run.batch``), which prose may name as well."""
    out = set()
    for f in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.startswith("ggopt.") and node.value != "ggopt.":
                out.add(node.value)
    return frozenset(out)


def _name_exists(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        if not Path(getattr(obj, "__file__", None) or REPO).resolve().is_relative_to(REPO):
            break  # another checkout's module (an editable install's finder found it)
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
            return True
        except AttributeError:
            break
    return any(k == name or k.startswith(name + ".") or (k.endswith(".") and name.startswith(k))
               for k in _key_prefixes())


def _dangling(rel: str, texts: list[tuple[int, str]]) -> list[str]:
    """``rel:line: reference`` of each path or name in ``texts`` that does not exist."""
    bad = []
    for line, text in texts:
        if rel not in GGML_PAGES:
            for m in PATH.finditer(text):
                before = text[max(0, m.start() - 60):m.start()]
                if EXTERNAL.search(before) or EXTERNAL.search(m.group(1)):
                    continue
                if not _path_exists(m.group(1), bool(m.group(2))):
                    bad.append(f"{rel}:{line}: {m.group(1)}")
        bad += [f"{rel}:{line}: {m.group(0)}" for m in NAME.finditer(text)
                if not _name_exists(m.group(0).rstrip("."))]
    return bad


def test_every_path_and_name_in_comments_docstrings_and_docs_exists():
    bad = [b for f in _files() for b in _dangling(str(f.relative_to(REPO)), _texts(f))]
    assert not bad, "\n".join(bad)


def test_the_reference_check_finds_what_moved():
    text = ("`ggopt/cli/main.py`, `opt/checks.py`, `backend/cpu/blas.SerialBlas`, "
            "`tests/kernels/test_<kernel>.py`, `ggopt.opt.Result.merge`, `ggopt.run.batch`, "
            "ggml's `examples/mnist/mnist-common.cpp`.\n\nMoved long ago, now gone: "
            "`ggopt/_threads.py`, `backend/blas.py`, `ggopt.dist.mpi_world`, "
            "`ggopt.opt._checks`, `docs/pretrained.md`")
    got = [b.split(": ", 1)[1] for b in _dangling("docs/probe.md", [(1, text)])]
    assert got == ["ggopt/_threads.py", "backend/blas.py", "docs/pretrained.md",
                   "ggopt.dist.mpi_world", "ggopt.opt._checks"]


@pytest.mark.parametrize("name", ["ggopt.cli.main.main", "ggopt.lm.finetune.FineTuner",
                                  "ggopt.models.mnist.data"])
def test_names_resolve_through_modules_and_attributes(name):
    assert _name_exists(name)
