"""Matrix-product compilers: BLAS on one thread per call, over slices whose bounds depend only
on the shapes, spread over ``n_threads`` threads (bit-identical for any count).

Thin products (a side of at most 8: LoRA's adapters and their gradients) run as one
:class:`~ggopt._kernels._thin.ThinPlan`, ggopt's own kernels. The others run as one
:class:`~ggopt._kernels._gemm.GemmPlan` (SciPy's ``sgemm`` called from an OpenMP team, no
Python per product); operands BLAS cannot read in place (no unit stride) take NumPy's
``matmul`` on Python worker threads instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...._kernels._fpmode import flushing, restore_this_thread, set_this_thread
from ....ops.order import in_ggml_order
from ....tensor import Op, Tensor
from ...base import Placement, Step
from .. import threads as _threads
from ..blas import products_blas
from . import ggml_order, lowp, quant
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend

#: ``(x, y, out)``: one product ``out = x @ y`` of 2-D slices
Product = tuple[np.ndarray, np.ndarray, np.ndarray]


def _matmul_pairs(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[Product]:
    """(a_slice, b_slice, c_slice) per (i3, i2) with ggml's dim-2/3 broadcast of ``a``."""
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    return [(a[i3 // r3, i2 // r2], b[i3, i2], c[i3, i2])
            for i3 in range(b.shape[0]) for i2 in range(b.shape[1])]


#: Products below this many multiply-adds run as one BLAS call (MNIST's fc2, 2.5M, runs 2x
#: faster cut in two now that an idle OpenMP team spins briefly instead of sleeping).
_SPLIT_MIN_MACS = 1 << 20
#: A dimension is cut in two when it has at least this many rows / columns.
_SPLIT_MIN_DIM = 128
#: A product whose ``y`` holds at least this many bytes and more columns than ``x`` has rows
#: (an LLM's output layer: 49152 x 576 floats, 113 MB) is cut along its columns: cut along its
#: rows, each piece would stream all of ``y`` from memory (SmolLM2's over 256 tokens, 2 threads:
#: 98 ms by rows, 88 by columns, on OpenBLAS and oneMKL alike).
_STREAMED_Y_BYTES = 32 << 20
#: The reduction dimension is cut in two when it is at least this many times the output's
#: longer side (a weight gradient: K = the tokens of a batch); each half then streams half of
#: both operands instead of one operand in full (10-15 % faster on the LLM's weight gradients).
_SPLIT_INNER_RATIO = 4


#: Products with a side of at most this many (a rank-8 LoRA adapter's ``A x``, ``B h`` with
#: K = 8, their gradients) run on ThinPlan, whose tiles hold 8 rows and reduce 8 at a time
#: (it takes sides up to 16, but from 9 on makes two passes, and MNIST's fc2, a side of 10, ran
#: faster cut in two on BLAS). Those ThinPlan leaves to BLAS (one token's products against a
#: weight, on GemmPlan's dot kernel; operands neither form reads) stay one piece below
#: ``_THIN_MAX_MACS`` multiply-adds: a parallel region costs about 1 ms when the machine's
#: cores are shared.
_THIN_SIDE = 8
_THIN_MAX_MACS = 4 << 20


def _halves(n: int) -> list[tuple[int, int]]:
    return [(0, n // 2), (n // 2, n)]


def _cut(rows: int, inner: int, cols: int) -> str | None:
    """How a product is cut in two, from its shape alone: along the reduction (``"inner"``: a
    long one with a small output), ``"rows"``, ``"cols"``, or not at all (None)."""
    macs = rows * inner * cols
    if macs < _SPLIT_MIN_MACS or (min(rows, inner, cols) <= _THIN_SIDE and
                                  macs < _THIN_MAX_MACS):
        return None
    if inner >= _SPLIT_INNER_RATIO * max(rows, cols):
        return "inner"
    if cols > rows and cols >= _SPLIT_MIN_DIM and 4 * inner * cols >= _STREAMED_Y_BYTES:
        return "cols"
    if rows >= _SPLIT_MIN_DIM:
        return "rows"
    if cols >= _SPLIT_MIN_DIM:
        return "cols"
    return None


#: ``(x, y, out, acc)``: one product ``out = x @ y``, then ``acc += out`` unless acc is None
Piece = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None"]
#: ``(out, scratch, acc)``: a split-K partial to add into ``out`` once every piece is done,
#: then ``acc += out`` unless acc is None
Sum = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


def _pieces(x: np.ndarray, y: np.ndarray, out: np.ndarray, acc: np.ndarray | None = None
            ) -> tuple[list[Piece], list[Sum]]:
    """``out = x @ y`` (then ``acc += out``) as pieces whose bounds depend only on the shapes.

    A long reduction with a small output is cut in two along it, the second half into a
    scratch array added afterwards (and ``out`` into ``acc`` after that).
    """
    cut = _cut(x.shape[0], x.shape[1], y.shape[1])
    if cut == "rows":
        return [(x[r0:r1], y, out[r0:r1], None if acc is None else acc[r0:r1])
                for r0, r1 in _halves(x.shape[0])], []
    if cut == "cols":
        return [(x, y[:, c0:c1], out[:, c0:c1], None if acc is None else acc[:, c0:c1])
                for c0, c1 in _halves(y.shape[1])], []
    if cut == "inner":
        (k0, k1), (k2, k3) = _halves(x.shape[1])
        scratch = np.empty_like(out)  # owned by the step, made once at compile time
        return [(x[:, k0:k1], y[k0:k1], out, None), (x[:, k2:k3], y[k2:k3], scratch, None)], \
            [(out, scratch, acc)]
    return [(x, y, out, acc)], []


def _gemm_plan(pieces: list[Piece], sums: list[Sum]) -> Any:
    """The pieces and split-K sums as one GemmPlan, or None if BLAS cannot read an operand
    in place."""
    from ...._kernels._gemm import GemmPlan  # loads SciPy's BLAS on the first product

    products_blas()
    plan = GemmPlan()
    for x, y, out, acc in pieces:
        if not plan.add(x, y, out, acc):
            return None
    for out, scratch, acc in sums:
        if not out.flags.c_contiguous or not (acc is None or acc.flags.c_contiguous):
            return None
        plan.add_sum(out.reshape(-1), scratch.reshape(-1),
                     None if acc is None else acc.reshape(-1))
    return plan


def _thin_plan(products: list[Product], accs: list[np.ndarray | None]) -> Any:
    """The products as one ThinPlan when every one has a side of at most ``_THIN_SIDE`` and
    fits one of its forms (``_kernels/_thin.pyx``); else None."""
    from ...._kernels._thin import ThinPlan

    plan = ThinPlan()
    for (x, y, out), acc in zip(products, accs, strict=True):
        if min(x.shape[0], x.shape[1], y.shape[1]) > _THIN_SIDE or not plan.add(x, y, out, acc):
            return None
    return plan


def _matmul_step(be: CPUBackend, products: list[Product]) -> Step:
    """``out = x @ y`` per (x, y, out) slice, on single-threaded BLAS.

    Each product is cut into pieces by its shape alone and the pieces are spread over
    ``be.n_threads`` threads; since each piece is always the same one-thread BLAS call, the
    result does not depend on the thread count.
    """
    thin = _thin_plan(products, [None] * len(products))
    if thin is not None:
        return lambda: thin.run(be.n_threads)
    pieces: list[Piece] = []
    sums: list[Sum] = []
    for x, y, out in products:
        p, s = _pieces(x, y, out)
        pieces += p
        sums += s
    plan = _gemm_plan(pieces, sums)
    if plan is not None:
        return lambda: plan.run(be.n_threads)
    return _numpy_step(be, [(x, y, out) for x, y, out, _ in pieces], sums)


def _numpy_step(be: CPUBackend, parts: list[Product], sums: list[Sum]) -> Step:
    """The same pieces on NumPy's ``matmul``, for operands without a unit stride. Each worker
    thread takes the calling thread's flush-to-zero state (``backend/cpu/denormals.py``)."""
    flush = [False]

    def run(group: list[Product]) -> Step:
        def task() -> None:
            saved = set_this_thread(flush[0])
            try:
                for x, y, out in group:
                    np.matmul(x, y, out=out)
            finally:
                restore_this_thread(saved)

        return task

    plans: dict[int, list[Step]] = {}

    def step() -> None:
        nt = min(be.n_threads, len(parts))
        tasks = plans.get(nt)
        if tasks is None:
            tasks = plans[nt] = [run(parts[i::nt]) for i in range(nt)]
        flush[0] = flushing()
        _threads.run_concurrently(tasks)
        for out, scratch, acc in sums:
            np.add(out, scratch, out=out)
            if acc is not None:
                np.add(acc, out, out=acc)

    return step


def _products(op: Op, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[Product]:
    """The 2-D products of a MUL_MAT or OUT_PROD node, in NumPy terms."""
    if op is Op.MUL_MAT:  # C (N, M) = B (N, K) @ A (M, K).T
        return [(b2, a2.T, c2) for a2, b2, c2 in _matmul_pairs(a, b, out)]
    # OUT_PROD: R (n1, n0) = B (K, n1).T @ A (K, n0)
    return [(b2.T, a2, c2) for a2, b2, c2 in _matmul_pairs(a, b, out)]


@COMPILERS.register(Op.MUL_MAT)
def _mul_mat(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    if in_ggml_order(node):
        return ggml_order.mul_mat_step(be, node, srcs, mem)
    if srcs[0].type.is_quantized:
        return quant.product_step(be, node, srcs, mem)
    if srcs[0].type.is_lowp:
        return lowp.product_step(be, node, srcs, mem)
    return _matmul_step(be, _products(Op.MUL_MAT, mem(srcs[0]), mem(srcs[1]), mem(node)))


@COMPILERS.register(Op.OUT_PROD)
def _out_prod(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    if srcs[0].type.is_quantized:
        return quant.product_step(be, node, srcs, mem)
    if srcs[0].type.is_lowp:
        return lowp.product_step(be, node, srcs, mem)
    return _matmul_step(be, _products(Op.OUT_PROD, mem(srcs[0]), mem(srcs[1]), mem(node)))


def product_then_add_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement,
                          acc: np.ndarray) -> Step | None:
    """``node`` (a MUL_MAT/OUT_PROD), then ``acc += node``, as one step: each piece of the
    product is added into ``acc`` by the thread that computed it, while it is still in cache
    (``backend/fusion.py``); a product cut along its reduction is added once its halves are
    summed. The same operations as the two nodes apart, so the same bits. None when BLAS
    cannot read an operand in place."""
    if srcs[0].type.is_quantized or srcs[0].type.is_lowp:
        return None
    out4 = mem(node)
    accs = [acc[i3, i2] for i3 in range(out4.shape[0]) for i2 in range(out4.shape[1])]
    products = _products(node.op, mem(srcs[0]), mem(srcs[1]), out4)
    thin = _thin_plan(products, list(accs))
    if thin is not None:
        return lambda: thin.run(be.n_threads)
    pieces: list[Piece] = []
    sums: list[Sum] = []
    for (x, y, out), acc2 in zip(products, accs, strict=True):
        p, s = _pieces(x, y, out, acc2)
        pieces += p
        sums += s
    plan = _gemm_plan(pieces, sums)
    return None if plan is None else (lambda: plan.run(be.n_threads))
