"""Softmax (scale, mask tiled by modulo, ALiBi slopes) and cross-entropy array compilers (the
cross-entropy on class ids: the one-hot formula on the picked elements)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....errors import InvalidValueError
from ....ops._base import params_of
from ....ops.softmax import CrossEntropyIdsParams, SoftMaxParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs, split_axes, tile_split

if TYPE_CHECKING:
    from ..backend import ArrayBackend


def _row_sum(xp: Any, x: Any) -> Any:
    """Row sums (last axis) in float64, keepdims."""
    return xp.sum(x, axis=3, keepdims=True, dtype=xp.float64)


def _alibi_slopes(n_head: int, max_bias: float) -> Any:
    n_log2 = 1 << int(np.floor(np.log2(F32(n_head))))
    m0 = np.power(F32(2), F32(-max_bias) / F32(n_log2), dtype=F32)
    m1 = np.power(F32(2), F32(-(max_bias / 2.0)) / F32(n_log2), dtype=F32)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1).astype(F32),
                    m1 ** (2 * (h - n_log2) + 1).astype(F32)).astype(F32)


def _softmax_rows(xp: Any, x: Any, d: Any) -> None:
    e = xp.exp(x - x.max(axis=3, keepdims=True))
    d[...] = e * (1.0 / _row_sum(xp, e)).astype(xp.float32)


@COMPILERS.register(Op.SOFT_MAX)
def _soft_max(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp, p = be.xp, params_of(node, SoftMaxParams)
    a, d = mem(srcs[0]), mem(node)
    s = F32(p.scale)
    if len(srcs) == 1:
        def plain() -> None:
            _softmax_rows(xp, a if s == 1 else a * s, d)

        return plain
    n3, n2, n1, n0 = a.shape
    m = mem(srcs[1])[:, :, :n1, :]
    ga, gm = tile_split((n3, n2), m.shape[:2])
    rest: list[tuple[int, ...]] = [(n1,), (n0,)]
    a_split, m_split = split_axes(xp, a, ga + rest), split_axes(xp, m, gm + rest)
    slope = None
    if p.max_bias > 0:
        lead = [1] * len(ga[0])
        slope = xp.asarray(_alibi_slopes(n2, p.max_bias).reshape(lead + list(ga[1]) + [1, 1]))

    def step() -> None:
        mm = m_split if slope is None else slope * m_split
        _softmax_rows(xp, (a_split * s + mm).reshape(a.shape), d)

    return step


@COMPILERS.register(Op.SOFT_MAX_BACK)
def _soft_max_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp, s = be.xp, F32(params_of(node, SoftMaxParams).scale)
    g, y, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        dot = _row_sum(xp, g * y).astype(xp.float32)
        d[...] = ((g - dot) * y) * s

    return step


def ce_rows(t: Tensor) -> tuple[int, int]:
    """(rows, classes) of a cross-entropy operand: rows run along ne1..ne3."""
    return t.nrows(), t.ne[0]


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS)
def _ce(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a4, b4, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    shape = ce_rows(srcs[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        sh = x - x.max(axis=1, keepdims=True)
        lse = xp.log(xp.sum(xp.exp(sh), axis=1, keepdims=True, dtype=xp.float64))
        d[...] = -xp.sum(y * (sh - lse)) / shape[0]

    return step


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS_BACK)
def _ce_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    g4, a4, b4 = (mem(s) for s in srcs)
    shape = ce_rows(srcs[1])
    d = mem(node).reshape(shape)
    nrows = F32(shape[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        inv = (1.0 / xp.sum(e, axis=1, keepdims=True, dtype=xp.float64)).astype(xp.float32)
        d[...] = (e * inv - y) * (g4[0, 0, 0, 0] / nrows)

    return step


def _ids_of(xp: Any, fn: str, ids4: Any, ncls: int, ignore: int) -> tuple[Any, Any, Any]:
    """(ids, rows kept, their ids), InvalidValueError for an id out of range."""
    t = ids4.reshape(-1)
    keep = t != ignore
    bad = keep & ((t < 0) | (t >= ncls))
    if bool(bad.any()):
        r = int(xp.argmax(bad))
        raise InvalidValueError(f"{fn}: the label id of row {r} is {int(t[r])}, out of range: "
                                f"expected a class in [0, {ncls}) or the ignore id {ignore}")
    rows = xp.flatnonzero(keep)
    return t, rows, t[rows]


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS_IDS)
def _ce_ids(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    ignore = params_of(node, CrossEntropyIdsParams).ignore_id
    a4, i4, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    shape = ce_rows(srcs[0])

    def step() -> None:
        _, rows, cls = _ids_of(xp, "cross_entropy_loss_ids", i4, shape[1], ignore)
        x = a4.reshape(shape)[rows]
        sh = x - x.max(axis=1, keepdims=True)
        lse = xp.log(xp.sum(xp.exp(sh), axis=1, dtype=xp.float64))
        d[...] = -xp.sum(sh[xp.arange(len(rows)), cls] - lse) / shape[0]

    return step


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS_IDS_BACK)
def _ce_ids_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    ignore = params_of(node, CrossEntropyIdsParams).ignore_id
    g4, a4, i4 = (mem(s) for s in srcs)
    shape = ce_rows(srcs[1])
    d = mem(node).reshape(shape)
    nrows = F32(shape[0])

    def step() -> None:
        t, rows, cls = _ids_of(xp, "cross_entropy_loss_ids_back", i4, shape[1], ignore)
        x = a4.reshape(shape)
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        p = e * (1.0 / xp.sum(e, axis=1, keepdims=True, dtype=xp.float64)).astype(xp.float32)
        p[rows, cls] -= F32(1)
        p *= g4[0, 0, 0, 0] / nrows
        p[t == ignore] = 0
        d[...] = p

    return step
