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
# low-precision products are defined as vdpbf16ps's fused steps (docs/low-precision.md), ggml's
# float order as llama.cpp's fused steps (docs/ggml-order.md).
FUSED_BY_DEFINITION = {"_lowp", "_ggml_order"}
# Modules with fused steps in named functions only: the rope's rotation and the K-quant
# products' block sums in ggml's order.
FUSED_FUNCTIONS = {"_rope": "ggopt_rope_row_fused", "_quant_dot": "ggopt_qdot_group_ggml"}
FMA = re.compile(r"\bv?f(n)?m(add|sub)(sub|add)?(132|213|231)[ps][sd]\b")
SYMBOL = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")


def _fused_by_function(asm: str) -> dict[str, set[str]]:
    """The fused multiply-adds of an objdump listing, by the function they are in."""
    found: dict[str, set[str]] = {}
    where = "?"
    for line in asm.splitlines():
        head = SYMBOL.match(line)
        if head:
            where = head.group(1)
            continue
        for m in FMA.finditer(line):
            found.setdefault(where, set()).add(m.group(0))
    return found


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
@pytest.mark.parametrize("lib", sorted(p.name for p in pathlib.Path(
    ggopt._kernels.__file__).parent.glob("_*.so")))
def test_no_fused_multiply_add(lib):
    module = lib.split(".")[0]
    if module in FUSED_BY_DEFINITION:
        pytest.skip(f"{lib} computes with fused multiply-adds by definition")
    path = pathlib.Path(ggopt._kernels.__file__).parent / lib
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True,
                         text=True, check=True).stdout
    allowed = FUSED_FUNCTIONS.get(module)
    found = {fn: ops for fn, ops in _fused_by_function(asm).items()
             if allowed is None or allowed not in fn}
    assert not found, f"{lib}: {found}"
