"""Inputs of the finite-difference gradient cases (tests/ops/test_<family>.py's CASES):
seeded uniform values, values away from the kinks at 0, tie-free grids and probability rows."""

from __future__ import annotations

import numpy as np


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def u32(*shape: int, lo: float = -2.0, hi: float = 2.0, seed: int = 0) -> np.ndarray:
    """Uniform float32 values in ``[lo, hi)`` from generator ``seed``."""
    return _rng(seed).uniform(lo, hi, shape).astype(np.float32)


def away(*shape: int, seed: int = 0) -> np.ndarray:
    """Values with ``0.5 <= |x| <= 2``: far from the kinks at 0."""
    r = _rng(seed)
    return (r.uniform(0.5, 2.0, shape) * r.choice([-1.0, 1.0], shape)).astype(np.float32)


def distinct(*shape: int, seed: int = 0) -> np.ndarray:
    """A permutation of a 0.1-spaced grid: no max-pool ties, even after a 1e-2 step."""
    n = int(np.prod(shape))
    return (_rng(seed).permutation(n).reshape(shape) * 0.1 - 0.05 * n).astype(np.float32)


def probs(*shape: int, seed: int = 0) -> np.ndarray:
    e = np.exp(u32(*shape, seed=seed))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def case_ops(cases: dict) -> tuple[set, set]:
    """The ops, and the unary functions, that the graphs of gradient ``cases`` (name ->
    ``(build(ctx, *tensors), arrays, params)``) contain."""
    import ggopt
    from ggopt.tensor import Op
    from tests.support.helpers import new_tensor

    ops, uops = set(), set()
    for build, arrays, _ in cases.values():
        ctx = ggopt.Context()
        out = build(ctx, *[new_tensor(ctx, a) for a in arrays])
        gf = ggopt.new_graph(ctx)
        ggopt.build_forward_expand(gf, out)
        for n in gf.nodes:
            ops.add(n.op)
            if n.op is Op.UNARY:
                uops.add(n.op_params)
    return ops, uops


def backward_rules_of(module: str) -> set:
    """The ops whose backward rule is defined in ``module`` (e.g. ``"ggopt.ops.rope"``)."""
    from ggopt.ops import BACKWARD

    return {op for op in BACKWARD if BACKWARD[op].__module__ == module}
