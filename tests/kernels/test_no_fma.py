"""setup.py's promise: no fused multiply-add in any compiled kernel, so that every rounding is
the one of the C source (GCC may emit FMA for patterns it recognises, such as complex
multiplication, even with -ffp-contract=off; a kernel has to be written around that)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

import ggopt._kernels

# Kernels whose C source asks for fused multiply-adds by name (fmaf, _mm512_fmadd_ps): the
# low-precision products are defined as vdpbf16ps's fused steps (docs/low-precision.md); ggml's
# float order, and the rope's ggml-order rotation, are llama.cpp's fused steps
# (docs/ggml-order.md).
FUSED_BY_DEFINITION = {"_lowp", "_ggml_order", "_rope"}
FMA = re.compile(r"\bv?f(n)?m(add|sub)(sub|add)?(132|213|231)[ps][sd]\b")


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
@pytest.mark.parametrize("lib", sorted(p.name for p in pathlib.Path(
    ggopt._kernels.__file__).parent.glob("_*.so")))
def test_no_fused_multiply_add(lib):
    if lib.split(".")[0] in FUSED_BY_DEFINITION:
        pytest.skip(f"{lib} computes with fused multiply-adds by definition")
    path = pathlib.Path(ggopt._kernels.__file__).parent / lib
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True,
                         text=True, check=True).stdout
    found = sorted({m.group(0) for m in FMA.finditer(asm)})
    assert not found, f"{lib}: {found}"
