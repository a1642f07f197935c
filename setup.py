"""Build the Cython kernels in ``ggopt/_kernels``.

Every ``ggopt/_kernels/*.pyx`` becomes an extension module. OpenMP is found by compiling and
running a tiny OpenMP program; when that fails the kernels are built serial (with a warning),
so the install never fails for lack of OpenMP.

Environment variables:

- ``GGOPT_NO_OPENMP=1``: build serial kernels without probing.
- ``GGOPT_NATIVE=1``: add ``-march=native`` (local benchmarking only; never for shipped wheels).

Flags are ``-O3 -fno-math-errno -fno-trapping-math -ffp-contract=off`` and never
``-ffast-math``: NaN and infinity semantics matter. None of the extra flags changes a result:
``-fno-math-errno`` only stops libm from setting ``errno`` (so ``sqrtf`` vectorizes),
``-fno-trapping-math`` only stops caring about floating-point exception flags (so branch-free
selects such as ``x > 0 ? x : 0`` vectorize), and ``-ffp-contract=off`` keeps ``a*b + c`` two
roundings, as in NumPy. Reassociation, finite-math and reciprocal approximations stay off.

The hot C loops are also built for AVX-512 (x86-64-v4) and AVX2 (x86-64-v3) and picked when
the module loads, on GCC >= 12 with glibc (``GGOPT_MULTIVERSION`` in
``ggopt/_kernels/_common.pxd``); with contraction off every copy computes the same bits.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

CYTHON_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
}

OPENMP_PROBE = r"""
#include <omp.h>
#include <stdio.h>

int main(void) {
    int n = 0;
    #pragma omp parallel
    {
        #pragma omp atomic
        n += 1;
    }
    printf("%d %d\n", n, omp_get_max_threads());
    return 0;
}
"""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _openmp_candidates(compiler_type: str) -> list[tuple[list[str], list[str]]]:
    """(compile flags, link flags) to try, best first, for this compiler."""
    if compiler_type == "msvc":
        return [(["/openmp"], [])]
    candidates = [(["-fopenmp"], ["-fopenmp"])]
    if sys.platform == "darwin":
        # Apple clang has no -fopenmp driver flag; it needs libomp (e.g. from Homebrew).
        candidates.insert(0, (["-Xpreprocessor", "-fopenmp"], ["-lomp"]))
    return candidates


def _optimization_flags(compiler_type: str) -> list[str]:
    if compiler_type == "msvc":
        return ["/O2"]
    flags = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"]
    if _env_flag("GGOPT_NATIVE"):
        flags.append("-march=native")
    return flags


class BuildExt(build_ext):
    """``build_ext`` that adds optimization flags and OpenMP when the compiler supports it."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        compiler_type = self.compiler.compiler_type
        compile_args = _optimization_flags(compiler_type)
        link_args: list[str] = []
        omp = None if _env_flag("GGOPT_NO_OPENMP") else self._find_openmp(compiler_type)
        if omp is None:
            reason = (
                "GGOPT_NO_OPENMP is set"
                if _env_flag("GGOPT_NO_OPENMP")
                else "the compiler could not build and run an OpenMP test program"
            )
            warnings.warn(
                f"ggopt: building serial kernels without OpenMP ({reason}); "
                "ggopt.openmp_enabled() will be False and every kernel runs on one thread",
                stacklevel=1,
            )
        else:
            compile_args += omp[0]
            link_args += omp[1]
        for ext in self.extensions:
            ext.extra_compile_args = list(ext.extra_compile_args or []) + compile_args
            ext.extra_link_args = list(ext.extra_link_args or []) + link_args
        super().build_extensions()

    def _find_openmp(self, compiler_type: str) -> tuple[list[str], list[str]] | None:
        for cflags, lflags in _openmp_candidates(compiler_type):
            if self._probe_openmp(cflags, lflags):
                return cflags, lflags
        return None

    def _probe_openmp(self, cflags: list[str], lflags: list[str]) -> bool:
        """Compile, link and run the OpenMP test program with these flags."""
        cwd = os.getcwd()
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            try:
                with open("omp_probe.c", "w") as f:
                    f.write(OPENMP_PROBE)
                objects = self.compiler.compile(["omp_probe.c"], extra_postargs=cflags)
                self.compiler.link_executable(objects, "omp_probe", extra_postargs=lflags)
                exe = os.path.join(tmp, self.compiler.executable_filename("omp_probe"))
                out = subprocess.run(
                    [exe], capture_output=True, text=True, timeout=60, check=True
                ).stdout.split()
                return len(out) == 2 and int(out[0]) >= 1 and int(out[1]) >= 1
            except Exception as exc:  # noqa: BLE001 - any failure means "no OpenMP"
                self.announce(f"OpenMP probe with {cflags} failed: {exc}", level=2)
                return False
            finally:
                os.chdir(cwd)


def _extensions() -> list[Extension]:
    sources = sorted(glob.glob(os.path.join("ggopt", "_kernels", "*.pyx"), root_dir=HERE))
    extensions = [
        Extension(
            os.path.splitext(src)[0].replace(os.sep, "."),
            [src],
            include_dirs=[np.get_include(), os.path.join("ggopt", "_kernels")],
            # a kernel's C headers: a change rebuilds every module (they are small)
            depends=sorted(glob.glob(os.path.join("ggopt", "_kernels", "*.h"), root_dir=HERE)),
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_22_API_VERSION")],
        )
        for src in sources
    ]
    return cythonize(extensions, compiler_directives=CYTHON_DIRECTIVES)


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
