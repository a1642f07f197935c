"""Random inputs and NumPy counterparts of ggml's tiling and axis order, for the op tests."""

from __future__ import annotations

import numpy as np

import ggopt
from tests.support.sizes import LARGE


def f32(rng: np.random.Generator, *shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def away_from_zero(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml tiling: ``b`` repeated whole along every axis to ``shape``."""
    return np.tile(b, [s // t for s, t in zip(shape, b.shape)])


def untile(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum of the tiles of ``a`` of shape ``shape`` (repeat_back)."""
    split = []
    for s, t in zip(a.shape, shape):
        split += [s // t, t]
    return a.reshape(split).sum(axis=tuple(range(0, 2 * a.ndim, 2)))


def to_ggml_order(x: np.ndarray) -> np.ndarray:
    """Index a 4-D NumPy-order array as ``[i0, i1, i2, i3]``."""
    return x.transpose(3, 2, 1, 0)


def transposed(c, t):
    """A non-contiguous view holding the values of ``t`` transposed back."""
    return ggopt.transpose(c, ggopt.cont(c, ggopt.transpose(c, t)))


#: the layouts of an op input in the graph tests: made contiguous, transposed, a view, large
LAYOUTS = ["contiguous", "transposed", "view", "large"]


def layout_input(rng, layout, lo, hi):
    """(input array, build of the op input from its tensor, NumPy of that op input)."""
    if layout == "contiguous":
        x = f32(rng, 3, 5, 7, lo=lo, hi=hi)
        return x, lambda c, t: t, x
    if layout == "transposed":
        x = f32(rng, 3, 5, 7, lo=lo, hi=hi)
        return x, lambda c, t: ggopt.transpose(c, t), x.swapaxes(1, 2)
    if layout == "view":  # rows 1..4 of a 5x9 matrix, columns 2..8
        x = f32(rng, 5, 9, lo=lo, hi=hi)
        return x, lambda c, t: ggopt.view_2d(c, t, 7, 4, t.nb[1], t.nb[1] + 2 * 4), x[1:, 2:]
    x = f32(rng, *LARGE, lo=lo, hi=hi)
    return x, lambda c, t: t, x
