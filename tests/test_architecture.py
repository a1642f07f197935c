"""The layout's promises: a core that imports no backend, one registry type, typed op params,
sub-packages visible without CuPy, small modules, and the shuffle that takes an RNG."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import ggopt
from ggopt import opt
from ggopt._registry import Registry
from ggopt.backend.array.ops import COMPILERS as XP_COMPILERS
from ggopt.backend.cpu.ops import COMPILERS as CPU_COMPILERS
from ggopt.backend.cuda.ops import FUSED_COMPILERS
from ggopt.ops import BACKWARD, OP_PARAMS
from ggopt.opt.rng import Mt19937
from ggopt.tensor import VIEW_OPS, Op

ROOT = pathlib.Path(ggopt.__file__).parent
CORE = ["tensor.py", "context.py", "graph.py", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "ops").glob("*.py"))]
FAMILIES = ["elementwise", "reduce", "softmax", "linalg", "conv", "rows", "optim", "views",
            "norm", "rope", "attention", "pointwise"]


def _imports(path: pathlib.Path) -> list[str]:
    """Every module an import statement in ``path`` names, anywhere in the file (relative
    imports resolved against its package under the repository root)."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    package = list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out += [mod] + [f"{mod}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("module", CORE)
def test_core_imports_no_backend(module):
    bad = [m for m in _imports(ROOT / module) if m.startswith("ggopt.backend")]
    assert not bad, f"{module} imports {bad}"


def test_import_ggopt_shows_subpackages_and_never_imports_cupy_or_mpi4py():
    code = ("import sys, ggopt; print('cupy' in sys.modules or 'mpi4py' in sys.modules, "
            "all(n in dir(ggopt) for n in ('backend', 'opt', 'distributed', 'io')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT.parent)
    assert out.stdout.split() == ["False", "True"]


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for pattern in ("*.py", "*.pyx", "*.pxd")
            for p in ROOT.rglob(pattern) if (n := len(p.read_text().splitlines())) > 500}
    assert not long


# The scheduler's side of the backend seam: these modules know Backend's interface only.
GENERIC_BACKEND = ["base.py", "buffer.py", "alloc.py", "sched.py", "plan_cache.py", "fusion.py",
                   "recompute.py", "profile.py", "__init__.py"]
DEVICE_PACKAGES = ("ggopt.backend.cpu", "ggopt.backend.array", "ggopt.backend.cuda",
                   "ggopt._kernels")


@pytest.mark.parametrize("module", [m for m in GENERIC_BACKEND if m != "__init__.py"])
def test_scheduler_side_imports_nothing_device_specific(module):
    bad = [m for m in _imports(ROOT / "backend" / module) if m.startswith(DEVICE_PACKAGES)]
    assert not bad, f"backend/{module} imports {bad}"


def test_backend_packages_are_grouped_by_device():
    top = {p.name for p in (ROOT / "backend").iterdir() if p.suffix == ".py"}
    assert top == set(GENERIC_BACKEND)
    assert {p.name for p in (ROOT / "backend").iterdir() if p.is_dir()
            and p.name != "__pycache__"} == {"cpu", "array", "cuda"}
    # the CPU's process policies live with the CPU backend, not at the package's top
    assert not any((ROOT / n).exists() for n in ("_threads.py", "_denormals.py",
                                                 "_wait_policy.py"))


def test_every_family_has_a_column():
    for fam in FAMILIES:
        assert (ROOT / "ops" / f"{fam}.py").exists()
        assert (ROOT / "backend" / "cpu" / "ops" / f"{fam}.py").exists()
        assert (ROOT / "backend" / "array" / "ops" / f"{fam}.py").exists()


def test_one_registry_type_everywhere():
    for table in (BACKWARD, CPU_COMPILERS, XP_COMPILERS, FUSED_COMPILERS):
        assert isinstance(table, Registry)
    computing = set(Op) - VIEW_OPS
    assert set(CPU_COMPILERS) == computing
    assert set(XP_COMPILERS) == computing
    assert set(FUSED_COMPILERS) <= computing


def test_registry_refuses_a_second_entry():
    table: Registry[str, object] = Registry("test")
    table.register("a")(len)
    with pytest.raises(KeyError, match="twice"):
        table.register("a")(len)


def test_op_params_are_frozen_and_named():
    ctx = ggopt.Context()
    x = ctx.new_tensor_4d(ggopt.F32, 6, 6, 2, 1)
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 2, 4)
    pos = ctx.new_tensor_1d(ggopt.I32, 2)
    nodes = [ggopt.scale(ctx, x, 2.0), ggopt.soft_max_ext(ctx, x, None, 0.5, 0.0),
             ggopt.im2col(ctx, k, x, 1, 1, 0, 0, 1, 1),
             ggopt.pool_2d(ctx, x, ggopt.OP_POOL_AVG, 2, 2, 2, 2, 0, 0),
             ggopt.view_1d(ctx, x, 4, 8), ggopt.permute(ctx, x, 1, 0, 2, 3),
             ggopt.acc(ctx, x, ggopt.view_1d(ctx, x, 2, 0), x.nb[1], x.nb[2], x.nb[3], 4),
             ggopt.rms_norm(ctx, x, 1e-5), ggopt.rope(ctx, x, pos, 4, ggopt.ROPE_TYPE_NORMAL),
             ggopt.diag_mask_inf(ctx, x, 0), ggopt.swiglu(ctx, x), ggopt.concat(ctx, x, x, 2),
             ggopt.conv_2d_direct(ctx, k, x, 1, 1, 1, 1, 1, 1),
             ggopt.cross_entropy_loss_ids(ctx, x, ctx.new_tensor_3d(ggopt.I32, 6, 2, 1)),
             ggopt.set_ggml_order(ggopt.mul_mat(ctx, x, x))]
    kinds = {type(n.op_params) for n in nodes}
    assert kinds == set(OP_PARAMS)
    assert nodes[0].op_params.s == 2.0 and nodes[2].op_params.s0 == 1
    assert nodes[3].op_params.op == ggopt.OP_POOL_AVG and nodes[4].op_params.offset == 8
    with pytest.raises(AttributeError):
        nodes[0].op_params.s = 3.0


def test_shuffle_takes_an_rng_or_its_owner():
    def perm(source) -> list[int]:
        ds = opt.Dataset(ggopt.F32, ggopt.F32, 1, 1, 8, 1)
        ds.shuffle(source, -1)
        return ds.permutation.tolist()

    class Owner:
        rng = Mt19937(7)

    assert perm(Mt19937(7)) == perm(Owner()) != list(range(8))
    with pytest.raises(ggopt.DTypeError, match="Mt19937"):
        perm(np.random.default_rng(0))


def test_cuda_preamble_and_kernel_sources_compile_as_c(tmp_path):
    # No GPU here: compile the CuPy kernels' bodies with the C compiler instead, with the
    # CUDA qualifiers defined away, so that a name or syntax error in the shared header or in
    # a kernel source fails on every machine.
    import shutil

    from ggopt.backend.cuda.ops import elementwise, optim
    from ggopt.backend.cuda.ops._base import preamble

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = ["#define __CUDACC_RTC__ 1", "#include <math.h>", "#define __device__",
             "#define __forceinline__ static inline", preamble()]
    for i, src in enumerate(elementwise._UNARY_SRC.values()):
        lines.append(f"float f{i}(float x) {{ float y; {src}; return y; }}")
    for i, src in enumerate(elementwise._UNARY_BACK_SRC.values()):
        lines.append(f"float b{i}(float x, float g) {{ float y; {src}; return y; }}")
    lines.append("float adamw(float w, float g, float m, float v, const float *p) "
                 f"{{ {optim._ADAMW_SRC}; return w + m + v; }}")
    lines.append(f"float sgd(float w, float g, const float *p) {{ {optim._SGD_SRC}; return w; }}")
    src = tmp_path / "kernels.c"
    src.write_text("\n".join(lines) + "\n")
    out = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-Wno-unused-function",
                          "-fsyntax-only", str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _import_graph() -> dict[str, set[str]]:
    """ggopt module -> the ggopt modules it imports (at any depth in the file)."""
    graph: dict[str, set[str]] = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[name] = {m for m in _imports(p) if m.startswith("ggopt.")}
    return graph


def test_op_families_do_not_import_each_other_in_a_cycle():
    graph = _import_graph()
    families = {f"ggopt.ops.{f}" for f in FAMILIES}
    for fam in families:
        seen, todo = set(), [m for m in graph[fam] if m in families]
        while todo:
            m = todo.pop()
            assert m != fam, f"{fam} imports itself through another op family"
            if m not in seen:
                seen.add(m)
                todo += [n for n in graph.get(m, ()) if n in families]


# --- no module reads another's private state --------------------------------------------------
_GUARDED = {"OptContext": "opt/context.py", "Scheduler": "backend/sched.py",
            "Dataset": "opt/dataset.py", "Result": "opt/result.py"}


def _private_names(module: str, cls: str) -> set[str]:
    """The ``_names`` of class ``cls``: set on ``self`` anywhere in its module, or defined in
    its body (methods, properties, class attributes); dunders excluded."""
    tree = ast.parse((ROOT / module).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and isinstance(node.ctx, ast.Store)):
            names.add(node.attr)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    for item in body.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_reads_the_private_state_of_a_context_scheduler_or_dataset():
    """Rule: outside the module defining OptContext, Scheduler or Dataset, no attribute
    access ``x._name`` where ``_name`` is one of that class's private names and ``x`` is
    anything but ``self`` or ``cls`` (a mixin's own ``self._name`` is the class's code). The
    check is by name, so it also refuses another object's attribute of the same private
    name: rename one of them. Covers ggopt, bench and tools (white-box tests may look
    inside)."""
    private = {cls: _private_names(module, cls) for cls, module in _GUARDED.items()}
    assert "_st" in private["OptContext"] and "_permutation" in private["Dataset"]
    assert "_loss_per_datapoint" in private["Result"]
    own = {ROOT / module: cls for cls, module in _GUARDED.items()}
    files = [p for d in (ROOT, ROOT.parent / "bench", ROOT.parent / "tools") if d.exists()
             for p in d.rglob("*.py")]
    bad = []
    for path in files:
        names = set().union(*(n for cls, n in private.items() if own.get(path) != cls))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in names
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} .{node.attr}")
    assert not bad, bad


# --- the test suite's own layout (docs/architecture.md, "Tests") ---------------------------

REPO = ROOT.parent
TESTS = REPO / "tests"
TEST_LAYERS = {"core", "ops", "kernels", "backend", "opt", "io", "cli", "distributed", "docs",
               "tokenizers", "models", "lm", "support", "data"}


def _test_module_names() -> set[str]:
    """Every test module and conftest, by its dotted name and by its bare file name (how a
    module on sys.path would import it)."""
    names = set()
    for p in TESTS.rglob("*.py"):
        if p.name.startswith("test_") or p.name == "conftest.py":
            names.add(".".join(p.relative_to(REPO).with_suffix("").parts))
            names.add(p.stem)
    return names


def _imports_a_test_module(imports: list[str], test_modules: set[str]) -> list[str]:
    return sorted({m for m in imports if m in test_modules})


def test_no_test_module_imports_another():
    # what tests share lives in tests/support; a test module is never a library
    test_modules = _test_module_names()
    bad = {str(p.relative_to(REPO)): found for p in sorted(TESTS.rglob("*.py"))
           if (found := _imports_a_test_module(_imports(p), test_modules))}
    assert not bad


def test_the_import_check_sees_test_modules(tmp_path):
    test_modules = {"tests.ops.test_rope", "test_rope", "tests.conftest", "conftest"}
    imports = _imports(TESTS / "ops" / "test_rope.py")
    assert not _imports_a_test_module(imports, test_modules)
    assert _imports_a_test_module(["tests.ops.test_rope", "tests.support.helpers"],
                                  test_modules) == ["tests.ops.test_rope"]
    assert _imports_a_test_module(["test_rope.f32"], test_modules) == []
    assert _imports_a_test_module(["test_rope"], test_modules) == ["test_rope"]


def test_bench_imports_nothing_from_tests():
    bare = {p.stem for p in TESTS.rglob("*.py")} - {"__init__"}
    found = {}
    for p in sorted((REPO / "bench").glob("*.py")):
        bad = [m for m in _imports(p) if m.split(".")[0] in bare | {"tests"}]
        if bad:
            found[p.name] = bad
    assert not found


def test_tests_are_laid_out_by_layer():
    # top level: the conftest and the whole-repository checks; every folder is a package, so
    # that same-named files in two layers (ops/test_rope.py, kernels/test_rope.py) coexist
    top = {p.name for p in TESTS.glob("*.py")}
    assert top == {"__init__.py", "conftest.py", "test_architecture.py",
                   "test_suite_hygiene.py", "test_no_crash_subprocess.py", "test_references.py"}
    dirs = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert dirs <= TEST_LAYERS
    for d in dirs - {"data"}:
        assert (TESTS / d / "__init__.py").is_file(), d
    # one test file per op family, beside its kernel tests
    for fam in FAMILIES:
        assert (TESTS / "ops" / f"test_{fam}.py").is_file(), fam


# Optional dependencies: imported inside the tests that need them (pytest.importorskip), so
# that `pip install -e ".[test]" && python -m pytest` collects and runs without them.
OPTIONAL = {"torch", "transformers", "peft", "llama_cpp", "mpi4py", "cupy", "cupyx",
            "matplotlib"}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError")
               for t in types)


def _import_time_optional_imports(source: str) -> list[str]:
    """``line: module`` of each import of an optional dependency that runs when the module is
    imported: outside every function, outside ``if TYPE_CHECKING:``, and not in a ``try`` that
    catches ImportError."""
    found: list[str] = []

    def visit(nodes: list[ast.AST], guarded: bool) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse, guarded)
            elif isinstance(node, ast.Try):
                visit(node.body, guarded or any(map(_catches_import_error, node.handlers)))
                visit([*node.handlers, *node.orelse, *node.finalbody], guarded)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if not node.level else [])
                found.extend(f"{node.lineno}: {n}" for n in names
                             if n.split(".")[0] in OPTIONAL and not guarded)
            else:
                visit(list(ast.iter_child_nodes(node)), guarded)

    visit(ast.parse(source).body, False)
    return found


def test_no_test_bench_or_tool_module_imports_an_optional_dependency_at_import_time():
    files = [*TESTS.rglob("*.py"), *(REPO / "bench").glob("*.py"), *(REPO / "tools").glob("*.py")]
    bad = {str(p.relative_to(REPO)): found for p in sorted(files)
           if (found := _import_time_optional_imports(p.read_text()))}
    assert not bad, f"import these inside the tests (pytest.importorskip): {bad}"


def test_the_optional_import_check_sees_what_runs_at_import_time():
    source = (
        "import numpy\nimport torch.nn\nfrom matplotlib import pyplot\n"
        "class A:\n    import peft\n"
        "if True:\n    import cupy\n"
        "try:\n    import llama_cpp\nexcept ImportError:\n    llama_cpp = None\n"
        "try:\n    import mpi4py\nexcept ValueError:\n    pass\n"
        "if TYPE_CHECKING:\n    import transformers\n"
        "def f():\n    import torch\n"
        "g = lambda: __import__('torch')\n"
    )
    assert _import_time_optional_imports(source) == [
        "2: torch.nn", "3: matplotlib", "5: peft", "7: cupy", "13: mpi4py"]
