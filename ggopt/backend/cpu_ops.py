"""Compilers from graph nodes to CPU steps: each binds the node's arrays once and returns a
zero-argument callable that runs one kernel (or a BLAS product) on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .. import _threads
from .._kernels import _conv, _copy, _get_rows, _optim, _reduce, _softmax
from .._kernels import _elementwise as ew
from ..errors import ShapeError
from ..tensor import Op, Tensor, UnaryOp
from . import conv_sparse
from .base import Step, check_row_indices

if TYPE_CHECKING:
    from .cpu import CPUBackend

__all__ = ["COMPILERS"]

Compiler = Callable[["CPUBackend", Tensor, tuple], Step]
COMPILERS: dict[Op, Compiler] = {}


def compiler(*ops: Op) -> Callable[[Compiler], Compiler]:
    def register(fn: Compiler) -> Compiler:
        for op in ops:
            COMPILERS[op] = fn
        return fn

    return register


_BINARY = {Op.ADD: ew.BIN_ADD, Op.SUB: ew.BIN_SUB, Op.MUL: ew.BIN_MUL, Op.DIV: ew.BIN_DIV}
_UNARY = {
    UnaryOp.NEG: ew.UN_NEG, UnaryOp.EXP: ew.UN_EXP, UnaryOp.RELU: ew.UN_RELU,
    UnaryOp.GELU: ew.UN_GELU, UnaryOp.SILU: ew.UN_SILU, UnaryOp.TANH: ew.UN_TANH,
    UnaryOp.SIGMOID: ew.UN_SIGMOID, UnaryOp.STEP: ew.UN_STEP, UnaryOp.ABS: ew.UN_ABS,
}
_SIMPLE = {Op.SQR: ew.UN_SQR, Op.SQRT: ew.UN_SQRT, Op.LOG: ew.UN_LOG}


def _rows(arr: np.ndarray) -> np.ndarray:
    """A 2-D (rows, ne0) view of a 4-D array, copying only when no view exists."""
    return arr.reshape(-1, arr.shape[-1])


@compiler(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def _binary(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    op = _BINARY[node.op]
    a, b, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    return lambda: ew.binary(op, a, b, d, be.n_threads)


@compiler(Op.SCALE)
def _scale(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    s, bias = node.op_params
    a, d = srcs[0].array4d(), node.array4d()
    return lambda: ew.scale(a, d, s, bias, be.n_threads)


@compiler(Op.SQR, Op.SQRT, Op.LOG, Op.UNARY)
def _unary(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    uop = _UNARY[node.op_params] if node.op is Op.UNARY else _SIMPLE[node.op]
    a, d = srcs[0].array4d(), node.array4d()
    return lambda: ew.unary(uop, a, d, be.n_threads)


@compiler(Op.UNARY_BACK)
def _unary_back(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    uop = _UNARY[node.op_params]
    x, g, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    return lambda: ew.unary_back(uop, x, g, d, be.n_threads)


@compiler(Op.SUM)
def _sum(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()

    def step() -> None:
        d[0, 0, 0, 0] = _reduce.sum_all(a, be.n_threads)

    return step


@compiler(Op.SUM_ROWS, Op.MEAN)
def _sum_rows(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    if node.op is Op.SUM_ROWS:
        return lambda: _reduce.sum_rows(a, d, be.n_threads)
    inv = 1.0 / a.shape[3] if a.shape[3] else float("nan")

    def step() -> None:
        _reduce.sum_rows(a, d, be.n_threads)
        ew.scale(d, d, inv, 0.0, be.n_threads)

    return step


@compiler(Op.REPEAT)
def _repeat(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    return lambda: _reduce.repeat(a, d, be.n_threads)


@compiler(Op.REPEAT_BACK)
def _repeat_back(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    if a.size == 0:  # a sum over no tiles
        return lambda: d.fill(0.0)
    return lambda: _reduce.repeat_back(a, d, be.n_threads)


@compiler(Op.ACC)
def _acc(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    nb, offset = node.op_params
    a, b, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    bt = srcs[1]
    part = np.ndarray((bt.ne[3], bt.ne[2], bt.ne[1], bt.ne[0]), dtype=np.float32,
                      buffer=node.buffer.data, offset=node.offset + offset,
                      strides=(nb[3], nb[2], nb[1], nb[0]))
    same = np.shares_memory(a, d) and a.__array_interface__ == d.__array_interface__

    def step() -> None:
        if not same:
            np.copyto(d, a)
        if b.size:
            ew.binary(ew.BIN_ADD, part, b, part, be.n_threads)

    return step


@compiler(Op.CPY, Op.DUP, Op.CONT)
def _copy_node(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    if a.shape == d.shape and a.dtype == d.dtype:
        return lambda: _copy.copy(a, d, be.n_threads)
    if a.shape == d.shape:
        return lambda: np.copyto(d, a, casting="unsafe")
    return lambda: np.copyto(d, a.reshape(d.shape), casting="unsafe")


@compiler(Op.SOFT_MAX)
def _soft_max(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    s = node.op_params
    return lambda: _softmax.soft_max(a, d, s, be.n_threads)


@compiler(Op.SOFT_MAX_BACK)
def _soft_max_back(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    g, y, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    return lambda: _softmax.soft_max_back(g, y, d, be.n_threads)


@compiler(Op.CROSS_ENTROPY_LOSS)
def _ce(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a4, b4, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()

    def step() -> None:
        d[0, 0, 0, 0] = _softmax.cross_entropy_loss(_rows(a4), _rows(b4), be.n_threads)

    return step


@compiler(Op.CROSS_ENTROPY_LOSS_BACK)
def _ce_back(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    g, a4, b4 = (s.array4d() for s in srcs)
    d = _rows(node.array4d())

    def step() -> None:
        _softmax.cross_entropy_loss_back(float(g[0, 0, 0, 0]), _rows(a4), _rows(b4), d,
                                         be.n_threads)

    return step


@compiler(Op.ARGMAX)
def _argmax(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d()[0, 0], node.array4d()[0, 0, 0]
    return lambda: _reduce.argmax(a, d, be.n_threads)


@compiler(Op.COUNT_EQUAL)
def _count_equal(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, b, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()

    def step() -> None:
        d[0, 0, 0, 0] = _reduce.count_equal(a, b, be.n_threads)

    return step


def _matmul_pairs(a: np.ndarray, b: np.ndarray, c: np.ndarray):
    """(a_slice, b_slice, c_slice) per (i3, i2) with ggml's dim-2/3 broadcast of ``a``."""
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    return [(a[i3 // r3, i2 // r2], b[i3, i2], c[i3, i2])
            for i3 in range(b.shape[0]) for i2 in range(b.shape[1])]


#: Products below this many multiply-adds run as one BLAS call.
_SPLIT_MIN_MACS = 1 << 22
#: A dimension is cut in two when it has at least this many rows / columns.
_SPLIT_MIN_DIM = 128
#: The reduction dimension is cut in two when the output is small and it is at least this long.
_SPLIT_MIN_INNER = 1 << 14


def _halves(n: int) -> list[tuple[int, int]]:
    return [(0, n // 2), (n // 2, n)]


def _slices(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> tuple[list[tuple], list[tuple]]:
    """``out = x @ y`` as (x, y, out) products whose bounds depend only on the shapes.

    Returns the products and the (out, scratch) pairs to add once they are all done: a long
    reduction with a small output is cut in two along it, the second half into a scratch array.
    """
    rows, inner, cols = x.shape[0], x.shape[1], y.shape[1]
    if rows * inner * cols < _SPLIT_MIN_MACS:
        return [(x, y, out)], []
    if rows >= _SPLIT_MIN_DIM:
        return [(x[r0:r1], y, out[r0:r1]) for r0, r1 in _halves(rows)], []
    if cols >= _SPLIT_MIN_DIM:
        return [(x, y[:, c0:c1], out[:, c0:c1]) for c0, c1 in _halves(cols)], []
    if inner >= _SPLIT_MIN_INNER:
        (k0, k1), (k2, k3) = _halves(inner)
        scratch = np.empty_like(out)  # owned by the step, made once at compile time
        return [(x[:, k0:k1], y[k0:k1], out), (x[:, k2:k3], y[k2:k3], scratch)], [(out, scratch)]
    return [(x, y, out)], []


def _matmul_step(be: CPUBackend, pairs: list) -> Step:
    """``np.matmul(x, y, out=out)`` per (x, y, out) slice, on single-threaded BLAS.

    Each product is cut into pieces by its shape alone and the pieces are spread over
    ``be.n_threads`` threads; since each piece is always the same one-thread BLAS call, the
    result does not depend on the thread count.
    """
    parts: list[tuple] = []
    sums: list[tuple] = []
    for x, y, out in pairs:
        p, s = _slices(x, y, out)
        parts += p
        sums += s
    if len(parts) == 1:
        x, y, out = parts[0]
        return lambda: np.matmul(x, y, out=out)

    def run(group: list[tuple]) -> Step:
        def task() -> None:
            for x, y, out in group:
                np.matmul(x, y, out=out)

        return task

    plans: dict[int, list[Step]] = {}

    def step() -> None:
        nt = min(be.n_threads, len(parts))
        tasks = plans.get(nt)
        if tasks is None:
            tasks = plans[nt] = [run(parts[i::nt]) for i in range(nt)]
        _threads.run_concurrently(tasks)
        for out, scratch in sums:
            np.add(out, scratch, out=out)

    return step


@compiler(Op.MUL_MAT)
def _mul_mat(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    # NumPy terms per 2-D slice: C (N, M) = B (N, K) @ A (M, K).T
    return _matmul_step(be, [(b2, a2.T, c2) for a2, b2, c2 in
                         _matmul_pairs(srcs[0].array4d(), srcs[1].array4d(), node.array4d())])


@compiler(Op.OUT_PROD)
def _out_prod(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    # NumPy terms per 2-D slice: R (n1, n0) = B (K, n1).T @ A (K, n0)
    return _matmul_step(be, [(b2.T, a2, c2) for a2, b2, c2 in
                         _matmul_pairs(srcs[0].array4d(), srcs[1].array4d(), node.array4d())])


@compiler(Op.GET_ROWS)
def _get_rows_c(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, idx, d = srcs[0].array4d(), srcs[1].array4d()[0], node.array4d()

    def step() -> None:
        check_row_indices("get_rows", idx, a.shape[2])
        _get_rows.get_rows(a, idx, d, be.n_threads)

    return step


@compiler(Op.GET_ROWS_BACK)
def _get_rows_back_c(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    g, idx, d = srcs[0].array4d()[0, 0], srcs[1].array4d()[0, 0, 0], node.array4d()[0, 0]

    def step() -> None:
        check_row_indices("get_rows_back", idx, d.shape[0])
        _get_rows.get_rows_back(g, idx, d, be.n_threads)

    return step


@compiler(Op.IM2COL)
def _im2col(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    k, x, d = srcs[0], srcs[1].array4d(), node.array4d()
    KW, KH = k.ne[0], k.ne[1]
    s0, s1, p0, p1, d0, d1 = prm = node.op_params

    def step() -> None:
        n = be.n_threads
        if conv_sparse.prefer_sparse(conv_sparse.im2col_scratch(x.shape, d.shape, KH, KW, prm,
                                                                n, False), x.size, d.size):
            conv_sparse.im2col_gather(x, d, KH, KW, prm)
        else:
            _conv.im2col(x, d, KH, KW, s0, s1, p0, p1, d0, d1, n)

    return step


@compiler(Op.IM2COL_BACK)
def _im2col_back(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    g, k, d = srcs[0].array4d(), srcs[1], node.array4d()
    KW, KH = k.ne[0], k.ne[1]
    s0, s1, p0, p1, d0, d1 = prm = node.op_params

    def step() -> None:
        n = be.n_threads
        if conv_sparse.prefer_sparse(conv_sparse.im2col_scratch(d.shape, g.shape, KH, KW, prm,
                                                                n, True), g.size, d.size):
            conv_sparse.im2col_back_scatter(g, d, KH, KW, prm)
        else:
            _conv.im2col_back(g, d, KH, KW, s0, s1, p0, p1, d0, d1, n)

    return step


@compiler(Op.POOL_2D)
def _pool(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    op, k0, k1, s0, s1, p0, p1 = node.op_params
    return lambda: _conv.pool_2d(a, d, op, k0, k1, s0, s1, p0, p1, be.n_threads)


@compiler(Op.POOL_2D_BACK)
def _pool_back(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    g, x, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    op, k0, k1, s0, s1, p0, p1 = node.op_params
    return lambda: _conv.pool_2d_back(g, x, d, op, k0, k1, s0, s1, p0, p1, be.n_threads)


def _flat(t: Tensor) -> np.ndarray:
    arr = t.array4d()
    flat = arr.reshape(-1)
    if not np.shares_memory(flat, arr):
        raise ShapeError(f"optimizer step: '{t.name}' must be contiguous")
    return flat


@compiler(Op.OPT_STEP_ADAMW)
def _adamw(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    w, g, m, v, p = (_flat(s) for s in srcs)
    return lambda: _optim.adamw_step(w, g, m, v, p, be.n_threads)


@compiler(Op.OPT_STEP_SGD)
def _sgd(be: CPUBackend, node: Tensor, srcs: tuple) -> Step:
    w, g, p = (_flat(s) for s in srcs)
    return lambda: _optim.sgd_step(w, g, p, be.n_threads)
