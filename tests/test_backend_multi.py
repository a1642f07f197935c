"""Two backends under one scheduler: a NumPy ArrayBackend (never a host backend, so graphs
really split and copy between it and the CPU) gives the CPU-only results.

The op table :data:`OP_CASES` checks every op of the xp backend against the CPU kernels,
with broadcasting and non-contiguous views; tests/test_backend_cupy.py runs it on the GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from helpers import new_tensor

import ggopt
from ggopt import backend as gb
from ggopt import opt
from ggopt.backend.array.backend import ArrayBackend, numpy_backend
from ggopt.backend.array.ops import COMPILERS
from ggopt.errors import DTypeError, InvalidValueError, ShapeError, StateError
from ggopt.tensor import Op, UnaryOp

F32 = np.float32
POOL_MAX, POOL_AVG = ggopt.OP_POOL_MAX, ggopt.OP_POOL_AVG


# --- running a graph on [front, cpu] or on the CPU alone ----------------------------------


def compute(front: gb.Backend | None, build: Callable, arrays: Sequence[np.ndarray],
            on_front: Sequence[int] = ()):
    """Compute ``build(cctx, *tensors)`` over ``[front, cpu]`` (``front`` None: the CPU alone).

    Tensors at the indices ``on_front`` live on the front backend (on the CPU without one);
    the others are CPU inputs. Returns host copies of the outputs, the scheduler, the outputs.
    """
    cpu = gb.cpu_init()
    backends = [cpu] if front is None else [front, cpu]
    ctx_in, ctx_front = ggopt.Context(), ggopt.Context()
    tensors = [new_tensor(ctx_front if i in on_front else ctx_in, a, f"x{i}")
               for i, a in enumerate(arrays)]
    for t in ctx_in.tensors:
        ggopt.set_input(t)
    gb.alloc_ctx_tensors(ctx_in, cpu)
    gb.alloc_ctx_tensors(ctx_front, backends[0])
    for t, a in zip(tensors, arrays):
        gb.tensor_set(t, a)
    cctx = ggopt.Context()
    outs = build(cctx, *tensors)
    outs = [outs] if isinstance(outs, ggopt.Tensor) else list(outs)
    g = ggopt.new_graph_custom(cctx, 4096, False)
    for o in outs:
        ggopt.set_output(o)
        ggopt.build_forward_expand(g, o)
    sched = gb.Scheduler(backends)
    sched.alloc_graph(g)
    sched.graph_compute(g)
    return [gb.tensor_get(o) for o in outs], sched, outs


@dataclasses.dataclass
class OpCase:
    id: str
    build: Callable
    arrays: Callable[[np.random.Generator], list[np.ndarray]]
    on_front: tuple[int, ...] = ()
    atol: float = 1e-6


def check_op_case(front: gb.Backend, case: OpCase, rtol: float = 1e-5, atol: float = 0.0) -> None:
    """``case`` computed on ``front`` (beside the CPU) equals the CPU-only result (absolute
    tolerance: the larger of ``atol`` and the case's)."""
    arrays = case.arrays(np.random.default_rng(7))
    want, _, _ = compute(None, case.build, arrays, case.on_front)
    got, sched, outs = compute(front, case.build, arrays, case.on_front)
    assert sched.get_tensor_backend(outs[0]) is front
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=max(atol, case.atol),
                                   err_msg=f"output {i}")


# --- data ---------------------------------------------------------------------------------


def _u(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(F32)


def _zeros_in(rng, *shape):
    a = _u(rng, *shape)
    a.reshape(-1)[::5] = 0  # relu/step/abs at exactly 0
    return a


def _ties(rng, *shape):
    return rng.integers(-3, 3, shape).astype(F32)


def _away(rng, *shape):
    return (_u(rng, *shape, lo=0.5, hi=2.0) * rng.choice([-1, 1], shape)).astype(F32)


def _probs(rng, *shape):
    e = np.exp(_u(rng, *shape))
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32)


A4 = (2, 3, 4, 6)


def _binary_cases() -> list[OpCase]:
    fns = {"add": ggopt.add, "sub": ggopt.sub, "mul": ggopt.mul, "div": ggopt.div}
    cases = []
    for name, fn in fns.items():
        for tile in [A4, (1, 3, 2, 3), (1, 1, 1, 6), (2, 1, 4, 1)]:
            cases.append(OpCase(f"{name}-{'x'.join(map(str, tile))}",
                                lambda c, a, b, fn=fn: fn(c, a, b),
                                lambda r, tile=tile: [_u(r, *A4), _away(r, *tile)]))
    cases += [
        OpCase("add-permuted-a", lambda c, a, b: ggopt.add(c, ggopt.permute(c, a, 1, 0, 2, 3), b),
               lambda r: [_u(r, *A4), _u(r, 1, 3, 1, 4)], on_front=(0,)),
        OpCase("mul-transposed-b", lambda c, a, b: ggopt.mul(c, a, ggopt.transpose(c, b)),
               lambda r: [_u(r, 5, 4), _u(r, 4, 5)], on_front=(1,)),
    ]
    return cases


def _unary_back(uop: UnaryOp) -> Callable:
    return lambda c, x, g: c.new_op(ggopt.F32, x.ne, Op.UNARY_BACK, (x, g), uop)


def _elementwise_cases() -> list[OpCase]:
    unary = {u: getattr(ggopt, u.value) for u in UnaryOp}
    cases = [
        OpCase("scale", lambda c, a: ggopt.scale(c, a, 0.75), lambda r: [_u(r, *A4)]),
        OpCase("scale-transposed", lambda c, a: ggopt.scale(c, ggopt.transpose(c, a), -2.0),
               lambda r: [_u(r, 3, 5)], on_front=(0,)),
        OpCase("sqr", ggopt.sqr, lambda r: [_u(r, *A4)]),
        OpCase("sqrt", ggopt.sqrt, lambda r: [_u(r, *A4, lo=0.0)]),
        OpCase("log", ggopt.log, lambda r: [_u(r, *A4, lo=0.1)]),
        OpCase("gelu-permuted", lambda c, a: ggopt.gelu(c, ggopt.permute(c, a, 2, 0, 1, 3)),
               lambda r: [_u(r, *A4, lo=-6, hi=6)], on_front=(0,)),
    ]
    for u, fn in unary.items():
        cases.append(OpCase(f"unary-{u.value}", lambda c, a, fn=fn: fn(c, a),
                            lambda r: [_zeros_in(r, *A4) * F32(3)]))
        if u is not UnaryOp.STEP:
            cases.append(OpCase(f"unary_back-{u.value}", _unary_back(u),
                                lambda r: [_zeros_in(r, *A4) * F32(3), _u(r, *A4)]))
    return cases


def _reduce_cases() -> list[OpCase]:
    return [
        OpCase("sum", ggopt.sum, lambda r: [_u(r, *A4)]),
        OpCase("sum_rows", ggopt.sum_rows, lambda r: [_u(r, *A4)]),
        OpCase("mean", ggopt.mean, lambda r: [_u(r, *A4)]),
        OpCase("sum_rows-transposed", lambda c, a: ggopt.sum_rows(c, ggopt.transpose(c, a)),
               lambda r: [_u(r, 7, 5)], on_front=(0,)),
        OpCase("repeat", lambda c, a, b: ggopt.repeat(c, a, b),
               lambda r: [_u(r, 1, 3, 1, 2), _u(r, *A4)]),
        OpCase("repeat_back", lambda c, a, b: ggopt.repeat_back(c, a, b),
               lambda r: [_u(r, *A4), _u(r, 1, 3, 2, 3)]),
        OpCase("acc", lambda c, a, b: ggopt.acc(c, a, b, 24, 96, 288, 4 * (1 + 6 + 24)),
               lambda r: [_u(r, *A4), _u(r, 1, 2, 2, 3)]),
        OpCase("argmax-ties", ggopt.argmax, lambda r: [_ties(r, 9, 5)]),
        OpCase("count_equal", ggopt.count_equal,
               lambda r: [r.integers(0, 3, (4, 6)).astype(np.int32),
                          r.integers(0, 3, (4, 6)).astype(np.int32)]),
    ]


def _copy_cases() -> list[OpCase]:
    return [
        OpCase("cont-permuted", lambda c, a: ggopt.cont(c, ggopt.permute(c, a, 3, 1, 0, 2)),
               lambda r: [_u(r, *A4)], on_front=(0,)),
        OpCase("dup", ggopt.dup, lambda r: [_u(r, *A4)]),
        OpCase("cpy-f16", lambda c, a, b: ggopt.cpy(c, a, b),
               lambda r: [_u(r, *A4), np.zeros((4, 36), np.float16)], on_front=(1,)),
        OpCase("cpy-i32", lambda c, a, b: ggopt.cpy(c, a, b),
               lambda r: [_u(r, 4, 6) * F32(10), np.zeros(24, np.int32)], on_front=(1,)),
        OpCase("cpy-transposed-src",
               lambda c, a, b: ggopt.cpy(c, ggopt.transpose(c, a), b),
               lambda r: [_u(r, 3, 5), np.zeros((5, 3), F32)], on_front=(0, 1)),
    ]


def _softmax_cases() -> list[OpCase]:
    return [
        OpCase("soft_max", ggopt.soft_max, lambda r: [_u(r, *A4, lo=-8, hi=8)]),
        OpCase("soft_max_ext", lambda c, a: ggopt.soft_max_ext(c, a, None, 0.5, 0.0),
               lambda r: [_u(r, *A4, lo=-8, hi=8)]),
        OpCase("soft_max-transposed", lambda c, a: ggopt.soft_max(c, ggopt.transpose(c, a)),
               lambda r: [_u(r, 6, 5)], on_front=(0,)),
        OpCase("soft_max_back", lambda c, g, y: ggopt.soft_max_ext_back(c, g, y, 0.3, 0.0),
               lambda r: [_u(r, *A4), _probs(r, *A4)]),
        OpCase("cross_entropy_loss", ggopt.cross_entropy_loss,
               lambda r: [_u(r, 2, 4, 10, lo=-5, hi=5), _probs(r, 2, 4, 10)]),
        OpCase("cross_entropy_loss_back", ggopt.cross_entropy_loss_back,
               lambda r: [np.array([1.7], F32), _u(r, 8, 10, lo=-5, hi=5), _probs(r, 8, 10)]),
    ]


def _matmul_cases() -> list[OpCase]:
    return [
        OpCase("mul_mat", ggopt.mul_mat, lambda r: [_u(r, 5, 7), _u(r, 6, 7)]),
        OpCase("mul_mat-broadcast", ggopt.mul_mat,
               lambda r: [_u(r, 1, 2, 5, 7), _u(r, 3, 4, 6, 7)], atol=1e-5),
        OpCase("mul_mat-transposed-b", lambda c, a, b: ggopt.mul_mat(c, a, ggopt.transpose(c, b)),
               lambda r: [_u(r, 5, 7), _u(r, 7, 6)], on_front=(1,)),
        OpCase("out_prod", ggopt.out_prod, lambda r: [_u(r, 7, 5), _u(r, 7, 6)]),
        OpCase("out_prod-broadcast", ggopt.out_prod,
               lambda r: [_u(r, 1, 2, 7, 5), _u(r, 3, 4, 7, 6)], atol=1e-5),
        OpCase("out_prod-transposed-b",
               lambda c, a, b: ggopt.out_prod(c, a, ggopt.transpose(c, b)),
               lambda r: [_u(r, 7, 5), _u(r, 6, 7)], on_front=(1,)),
    ]


def _rows_cases() -> list[OpCase]:
    return [
        OpCase("get_rows", ggopt.get_rows,
               lambda r: [_u(r, 2, 7, 5), r.integers(0, 7, (2, 4)).astype(np.int32)]),
        OpCase("get_rows_back", lambda c, g, i, like: ggopt.get_rows_back(c, g, i, like),
               lambda r: [_u(r, 6, 5), np.array([3, 0, 3, 6, 3, 1], np.int32),
                          np.zeros((7, 5), F32)]),
    ]


_CONV = [(1, 1, 1, 1, 1, 1), (2, 2, 0, 0, 1, 1), (1, 2, 2, 1, 2, 1),
         # paddings, strides and dilations far beyond the image: no padded copy of it
         (2**16, 2**16, 2**20, 2**20, 1, 1), (2**29, 2**29, 2**29, 2**29, 2**29, 2**29)]


def _conv_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_cases() -> list[OpCase]:
    cases = []
    for prm in _CONV:
        s0, s1, p0, p1, d0, d1 = prm
        oh, ow = _conv_out(9, 3, s1, p1, d1), _conv_out(8, 2, s0, p0, d0)
        tag = "-".join(map(str, prm))
        cases += [
            OpCase(f"im2col-{tag}", lambda c, k, x, prm=prm: ggopt.im2col(c, k, x, *prm),
                   lambda r: [_u(r, 3, 2, 3, 2), _u(r, 2, 2, 9, 8)]),
            OpCase(f"im2col_back-{tag}",
                   lambda c, g, k, prm=prm: ggopt.im2col_back(c, g, k, (8, 9, 2, 2), *prm),
                   lambda r, oh=oh, ow=ow: [_u(r, 2, oh, ow, 12), _u(r, 3, 2, 3, 2)]),
            OpCase(f"conv_2d-{tag}", lambda c, k, x, prm=prm: ggopt.conv_2d(c, k, x, *prm),
                   lambda r: [_u(r, 3, 2, 3, 2), _u(r, 2, 2, 9, 8)], atol=1e-5),
            OpCase(f"conv_2d_back_input-{tag}",
                   lambda c, k, g, prm=prm: ggopt.conv_2d_back_input(c, k, g, (8, 9, 2, 2), *prm),
                   lambda r, oh=oh, ow=ow: [_u(r, 3, 2, 3, 2), _u(r, 2, 3, oh, ow)], atol=1e-5),
            OpCase(f"conv_2d_back_kernel-{tag}",
                   lambda c, x, g, prm=prm: ggopt.conv_2d_back_kernel(c, x, g, (2, 3, 2, 3),
                                                                      *prm),
                   lambda r, oh=oh, ow=ow: [_u(r, 2, 2, 9, 8), _u(r, 2, 3, oh, ow)], atol=1e-4),
        ]
    cases.append(OpCase("im2col-permuted-x",
                        lambda c, k, x: ggopt.im2col(c, k, ggopt.permute(c, x, 1, 0, 2, 3),
                                                     *_CONV[0]),
                        lambda r: [_u(r, 3, 2, 3, 2), _u(r, 2, 2, 8, 9)], on_front=(1,)))
    cases.append(OpCase("conv_2d-permuted-x",
                        lambda c, k, x: ggopt.conv_2d_direct(c, k, ggopt.permute(c, x, 1, 0, 2, 3),
                                                             *_CONV[2]),
                        lambda r: [_u(r, 3, 2, 3, 2), _u(r, 2, 2, 8, 9)], on_front=(1,),
                        atol=1e-5))
    cases.append(OpCase("conv_2d_back_kernel-transposed-g",
                        lambda c, x, g: ggopt.conv_2d_back_kernel(
                            c, x, ggopt.transpose(c, g), (2, 3, 2, 3), *_CONV[0]),
                        lambda r: [_u(r, 2, 2, 9, 8), _u(r, 2, 3, 9, 9)], on_front=(1,),
                        atol=1e-4))
    pools = [(2, 2, 2, 2, 0, 0), (3, 3, 2, 2, 1, 1), (3, 2, 1, 2, 1, 0)]
    for op in (POOL_MAX, POOL_AVG):
        name = "max" if op == POOL_MAX else "avg"
        for prm in pools:
            k0, k1, s0, s1, p0, p1 = prm
            oh = int((7 + 2 * p1 - k1) / s1) + 1
            ow = int((8 + 2 * p0 - k0) / s0) + 1
            tag = f"{name}-" + "-".join(map(str, prm))
            cases += [
                OpCase(f"pool_2d-{tag}",
                       lambda c, x, op=op, prm=prm: ggopt.pool_2d(c, x, op, *prm),
                       lambda r: [_ties(r, 2, 3, 7, 8)]),
                OpCase(f"pool_2d_back-{tag}",
                       lambda c, g, x, op=op, prm=prm: ggopt.pool_2d_back(c, g, x, op, *prm),
                       lambda r, oh=oh, ow=ow: [_u(r, 2, 3, oh, ow), _ties(r, 2, 3, 7, 8)]),
            ]
    cases.append(OpCase("pool_2d-max-transposed",
                        lambda c, x: ggopt.pool_2d(c, ggopt.transpose(c, x), POOL_MAX,
                                                   3, 3, 2, 2, 1, 1),
                        lambda r: [_u(r, 2, 3, 8, 7)], on_front=(0,)))
    return cases


def _adamw(c, w, g, m, v, p):
    ggopt.set_param(w)
    return [ggopt.opt_step_adamw(c, w, g, m, v, p), m, v]


def _sgd(c, w, g, p):
    ggopt.set_param(w)
    return ggopt.opt_step_sgd(c, w, g, p)


def _optim_cases() -> list[OpCase]:
    b1, b2, t = 0.9, 0.999, 3
    adamw = np.array([1e-2, b1, b2, 1e-8, 0.1, 1 / (1 - b1**t), 1 / (1 - b2**t)], F32)
    return [
        OpCase("opt_step_adamw", _adamw,
               lambda r: [_u(r, 4, 6), _u(r, 4, 6), _u(r, 4, 6) * F32(0.1),
                          _u(r, 4, 6, lo=0.0, hi=0.1), adamw], on_front=(0, 2, 3)),
        OpCase("opt_step_sgd", _sgd,
               lambda r: [_u(r, 4, 6), _u(r, 4, 6), np.array([0.05, 0.01], F32)],
               on_front=(0,)),
    ]


def _causal(r, *shape):
    m = _u(r, *shape)
    rows, cols = np.triu_indices(shape[-2], 1, shape[-1])
    m[..., rows, cols] = -np.inf
    return m


def _rope_case(name: str, n_dims: int, mode: int, yarn: bool, ff: bool, back: bool) -> OpCase:
    fn = ggopt.rope_ext_back if back else ggopt.rope_ext
    prm = (64, 500.0, 0.5, 1.0, 0.8, 32.0, 1.0) if yarn else (0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)

    def build(c, a, p, *f):
        return fn(c, a, p, f[0] if f else None, n_dims, mode, *prm)

    def arrays(r):
        out = [_u(r, 2, 5, 3, 8), r.integers(0, 40, 5).astype(np.int32)]
        return out + [_u(r, 4, lo=0.5, hi=3.0)] if ff else out

    return OpCase(name, build, arrays, atol=2e-5)


def _transformer_cases() -> list[OpCase]:
    normal, neox = ggopt.ROPE_TYPE_NORMAL, ggopt.ROPE_TYPE_NEOX
    return [
        OpCase("rms_norm", lambda c, a: ggopt.rms_norm(c, a, 1e-5), lambda r: [_u(r, *A4)]),
        OpCase("rms_norm-transposed",
               lambda c, a: ggopt.rms_norm(c, ggopt.transpose(c, a), 1e-6),
               lambda r: [_u(r, 6, 5)], on_front=(0,)),
        OpCase("rms_norm_back", lambda c, g, x: ggopt.rms_norm_back(c, g, x, 1e-5),
               lambda r: [_u(r, *A4), _u(r, *A4)], atol=1e-5),
        OpCase("norm", lambda c, a: ggopt.norm(c, a, 1e-5), lambda r: [_u(r, *A4)], atol=1e-5),
        OpCase("norm_back", lambda c, g, x: ggopt.norm_back(c, g, x, 1e-5),
               lambda r: [_u(r, *A4), _u(r, *A4)], atol=1e-5),
        OpCase("diag_mask_inf", lambda c, a: ggopt.diag_mask_inf(c, a, 1),
               lambda r: [_u(r, *A4)]),
        OpCase("diag_mask_zero", lambda c, a: ggopt.diag_mask_zero(c, a, 0),
               lambda r: [_u(r, *A4)]),
        OpCase("soft_max_ext-causal", lambda c, a, m: ggopt.soft_max_ext(c, a, m, 0.25, 0.0),
               lambda r: [_u(r, 2, 3, 4, 6, lo=-8, hi=8), _causal(r, 1, 1, 5, 6)]),
        OpCase("soft_max_ext-tiled-alibi",
               lambda c, a, m: ggopt.soft_max_ext(c, a, m, 0.7, 8.0),
               lambda r: [_u(r, 2, 6, 4, 6, lo=-8, hi=8), _u(r, 2, 3, 4, 6)]),
        OpCase("soft_max_ext-transposed-mask",
               lambda c, a, m: ggopt.soft_max_ext(c, a, ggopt.transpose(c, m), 1.0, 0.0),
               lambda r: [_u(r, 3, 4, 6), _u(r, 6, 4)], on_front=(1,)),
        _rope_case("rope-normal", 8, normal, False, False, False),
        _rope_case("rope-neox-partial-ff", 6, neox, False, True, False),
        _rope_case("rope-yarn", 8, normal, True, False, False),
        _rope_case("rope_back-neox-yarn-ff", 4, neox, True, True, True),
        OpCase("swiglu", ggopt.swiglu, lambda r: [_u(r, 2, 3, 4, 10, lo=-6, hi=6)]),
        OpCase("swiglu_swapped", ggopt.swiglu_swapped, lambda r: [_u(r, 2, 3, 4, 10, lo=-6, hi=6)]),
        OpCase("swiglu_split", ggopt.swiglu_split,
               lambda r: [_u(r, *A4, lo=-6, hi=6), _u(r, *A4)]),
        OpCase("sin", ggopt.sin, lambda r: [_u(r, *A4, lo=-9, hi=9)]),
        OpCase("cos", ggopt.cos, lambda r: [_u(r, *A4, lo=-9, hi=9)]),
        OpCase("add1", ggopt.add1, lambda r: [_u(r, *A4), _u(r, 1)]),
        OpCase("concat-0", lambda c, a, b: ggopt.concat(c, a, b, 0),
               lambda r: [_u(r, *A4), _u(r, 2, 3, 4, 2)]),
        OpCase("concat-3-permuted",
               lambda c, a, b: ggopt.concat(c, ggopt.permute(c, a, 1, 0, 2, 3), b, 3),
               lambda r: [_u(r, 1, 3, 6, 4), _u(r, 2, 3, 4, 6)], on_front=(0,)),
    ]


OP_CASES: list[OpCase] = (_binary_cases() + _elementwise_cases() + _reduce_cases()
                          + _copy_cases() + _softmax_cases() + _matmul_cases() + _rows_cases()
                          + _conv_cases() + _optim_cases() + _transformer_cases())


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.id)
def test_xp_op_matches_cpu(case):
    check_op_case(numpy_backend(), case)


def test_op_table_covers_every_xp_op():
    covered = set()
    for case in OP_CASES:
        ctx = ggopt.Context()
        ts = [new_tensor(ctx, a) for a in case.arrays(np.random.default_rng(0))]
        out = case.build(ctx, *ts)
        covered.add((out if isinstance(out, ggopt.Tensor) else out[0]).op)
    missing = set(COMPILERS) - covered
    assert not missing, f"ops without a case: {sorted(o.name for o in missing)}"


# --- whole graphs on [NumPy backend, CPU] vs the CPU alone --------------------------------


def _mlp(c, x, w1, b1, w2, b2):
    h = ggopt.relu(c, ggopt.add(c, ggopt.mul_mat(c, w1, x), b1))
    return ggopt.add(c, ggopt.mul_mat(c, w2, h), b2)


def _cnn(c, x, k, bk, w, bw):
    y = ggopt.conv_2d(c, k, x, 1, 1, 1, 1, 1, 1)
    y = ggopt.relu(c, ggopt.add(c, y, bk))
    y = ggopt.pool_2d(c, y, POOL_MAX, 2, 2, 2, 2, 0, 0)
    y = ggopt.reshape_2d(c, y, y.ne[0] * y.ne[1] * y.ne[2], y.ne[3])
    return ggopt.add(c, ggopt.mul_mat(c, w, y), bw)


def _mlp_arrays(rng):
    labels = np.eye(10, dtype=F32)[rng.integers(0, 10, 8)]
    return [_u(rng, 8, 12), labels, _u(rng, 16, 12, lo=-0.5, hi=0.5), _u(rng, 16),
            _u(rng, 10, 16, lo=-0.5, hi=0.5), _u(rng, 10)]


def _cnn_arrays(rng):
    labels = np.eye(10, dtype=F32)[rng.integers(0, 10, 3)]
    return [_u(rng, 3, 1, 8, 8), labels, _u(rng, 4, 1, 3, 3, lo=-0.5, hi=0.5),
            _u(rng, 1, 4, 1, 1), _u(rng, 10, 64, lo=-0.3, hi=0.3), _u(rng, 10)]


def forward_backward(front, model, arrays):
    """Loss and parameter gradients of ``model`` (inputs 0-1 on the CPU, params on front)."""
    cpu = gb.cpu_init()
    backends = [cpu] if front is None else [front, cpu]
    ctx_in, ctx_par = ggopt.Context(), ggopt.Context()
    ts = [new_tensor(ctx_in if i < 2 else ctx_par, a, f"t{i}") for i, a in enumerate(arrays)]
    for t in ts[:2]:
        ggopt.set_input(t)
    for t in ts[2:]:
        ggopt.set_param(t)
    gb.alloc_ctx_tensors(ctx_in, cpu)
    gb.alloc_ctx_tensors(ctx_par, backends[0])
    for t, a in zip(ts, arrays):
        gb.tensor_set(t, a)
    cctx = ggopt.Context()
    loss = ggopt.cross_entropy_loss(cctx, model(cctx, ts[0], *ts[2:]), ts[1])
    ggopt.set_loss(loss)
    ggopt.set_output(loss)
    gf = ggopt.new_graph_custom(cctx, 4096, True)
    ggopt.build_forward_expand(gf, loss)
    gbk = ggopt.graph_dup(cctx, gf)
    ggopt.build_backward_expand(cctx, gbk)
    grads = [ggopt.graph_get_grad(gbk, t) for t in ts[2:]]
    for g in grads:
        ggopt.set_output(g)
    sched = gb.Scheduler(backends)
    sched.alloc_graph(gbk)
    ggopt.graph_reset(gbk)
    sched.graph_compute(gbk)
    return [gb.tensor_get(loss)] + [gb.tensor_get(g) for g in grads], sched


_SUBSETS = {
    "mlp": {Op.MUL_MAT, Op.OUT_PROD, Op.CROSS_ENTROPY_LOSS_BACK, Op.UNARY_BACK},
    "cnn": {Op.CONV_2D, Op.CONV_2D_BACK_KERNEL, Op.MUL_MAT, Op.POOL_2D, Op.POOL_2D_BACK,
            Op.OUT_PROD, Op.REPEAT_BACK},
}


@pytest.mark.parametrize("subset", [True, False], ids=["subset", "all-ops"])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_forward_backward_matches_cpu(model, subset):
    fn, make = {"mlp": (_mlp, _mlp_arrays), "cnn": (_cnn, _cnn_arrays)}[model]
    arrays = make(np.random.default_rng(3))
    want, _ = forward_backward(None, fn, arrays)
    front = numpy_backend(_SUBSETS[model] if subset else None)
    got, sched = forward_backward(front, fn, arrays)
    assert sched.get_n_copies() > 0
    if subset:
        assert sched.get_n_splits() > 1
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")


def train_adamw(front, nsteps=3, params_on_cpu=False):
    """``nsteps`` AdamW steps of the MLP through OptContext (static tensors on backend 0)."""
    rng = np.random.default_rng(11)
    x, labels, *params = _mlp_arrays(rng)
    cpu = gb.cpu_init()
    backends = [cpu] if front is None else [front, cpu]
    sched = gb.Scheduler(backends)
    ctx_in, ctx_par = ggopt.Context(), ggopt.Context()
    inputs = new_tensor(ctx_in, x, "inputs")
    ggopt.set_input(inputs)
    ps = [new_tensor(ctx_par, a, f"p{i}") for i, a in enumerate(params)]
    for t in ps:
        ggopt.set_param(t)
    gb.alloc_ctx_tensors(ctx_in, cpu)
    gb.alloc_ctx_tensors(ctx_par, cpu if params_on_cpu else backends[0])
    for t, a in zip([inputs, *ps], [x, *params]):
        gb.tensor_set(t, a)
    cctx = ggopt.Context()
    logits = _mlp(cctx, inputs, *ps)
    p = opt.default_params(sched, opt.LossType.CROSS_ENTROPY)
    p.ctx_compute, p.inputs, p.outputs = cctx, inputs, logits
    losses = []
    with opt.OptContext(p) as octx:
        for _ in range(nsteps):
            octx.alloc(True)
            gb.tensor_set(inputs, x)
            gb.tensor_set(octx.labels, labels)
            result = opt.Result()
            octx.eval(result)
            losses.append(result.loss()[0])
        splits, copies = sched.get_n_splits(), sched.get_n_copies()
        labels_backend = sched.get_tensor_backend(octx.labels)
    return [gb.tensor_get(t) for t in ps], np.array(losses), (splits, copies, labels_backend)


@pytest.mark.parametrize("subset", [True, False], ids=["subset", "all-ops"])
def test_adamw_training_matches_cpu(subset):
    want_params, want_losses, _ = train_adamw(None)
    front = numpy_backend({Op.MUL_MAT, Op.OUT_PROD, Op.OPT_STEP_ADAMW} if subset else None)
    got_params, got_losses, (splits, copies, labels_backend) = train_adamw(front)
    assert labels_backend is front  # ggml-opt's static tensors go to backend 0
    assert copies > 0
    if subset:
        assert splits > 1
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    assert not np.allclose(want_losses[0], want_losses[-1])  # the steps moved the weights
    for g, w in zip(got_params, want_params):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_optimizer_step_refuses_moments_on_another_backend():
    # The AdamW step updates m and v in place: running it on the parameters' backend (CPU)
    # while the moments live on backend 0 would update copies, so alloc refuses.
    with pytest.raises(StateError, match="updates .* in place"):
        train_adamw(numpy_backend(), nsteps=1, params_on_cpu=True)


# --- the backend itself -------------------------------------------------------------------


@pytest.mark.parametrize("back", [False, True])
def test_array_backend_pooling_with_absurd_padding_is_refused_and_recovers(back):
    """The array backends pool a padded copy of the input: padding far beyond the image is an
    OutOfMemoryError at alloc_graph (not a bare MemoryError), and the scheduler stays usable."""
    ctx_w, ctx = ggopt.Context(), ggopt.Context()
    x = ctx_w.new_tensor_4d(ggopt.F32, 8, 8, 2, 1)
    ggopt.set_param(x)
    sched = gb.Scheduler([numpy_backend(), gb.cpu_init()])
    gb.alloc_ctx_tensors(ctx_w, sched.backends[0])
    gb.tensor_set(x, np.ones(128, F32))
    y = ggopt.pool_2d(ctx, x, ggopt.OP_POOL_MAX, 3, 3, 2**20, 2**20, 2**20, 2**20)
    if back:
        y = ggopt.pool_2d_back(ctx, y, x, ggopt.OP_POOL_MAX, 3, 3, 2**20, 2**20, 2**20, 2**20)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, y)
    with pytest.raises(ggopt.OutOfMemoryError, match="padded copy"):
        sched.alloc_graph(g)
    ok = ggopt.scale(ctx, x, 2.0)
    g2 = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g2, ok)
    sched.reset()
    sched.graph_compute(g2)
    np.testing.assert_array_equal(gb.tensor_get(ok).reshape(-1), np.full(128, 2.0, F32))


def test_numpy_backend_is_not_host_and_transfers():
    be = numpy_backend()
    assert not be.is_host and be.name == "NumPy"
    ctx = ggopt.Context()
    t = ctx.new_tensor_2d(ggopt.F32, 3, 2)
    gb.alloc_ctx_tensors(ctx, be)
    data = np.arange(6, dtype=F32).reshape(2, 3)
    gb.tensor_set(t, data)
    np.testing.assert_array_equal(gb.tensor_get(t), data)
    with pytest.raises(ggopt.StateError, match="tensor_get"):
        t.numpy()
    gb.tensor_fill(t, 2.5)
    np.testing.assert_array_equal(gb.tensor_get(t), np.full((2, 3), 2.5, F32))


def test_supports_op_follows_the_subset():
    ctx = ggopt.Context()
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)
    s, m = ggopt.sum(ctx, a), ggopt.mul_mat(ctx, a, a)
    only = numpy_backend({Op.MUL_MAT})
    assert only.supports_op(m) and not only.supports_op(s)
    assert only.supports_op(ggopt.transpose(ctx, a))  # views compute nothing
    assert numpy_backend().supports_op(s)


def test_bad_arguments_raise():
    with pytest.raises(DTypeError, match="Op"):
        numpy_backend(["mul_mat"])
    with pytest.raises(DTypeError, match="name"):
        ArrayBackend(np, 3)


def test_out_of_range_rows_raise_shape_error():
    def build(c, a, i):
        return ggopt.get_rows(c, a, i)

    with pytest.raises(ShapeError, match="get_rows"):
        compute(numpy_backend(), build, [np.zeros((4, 3), F32), np.array([0, 4], np.int32)])


def test_unary_back_of_step_raises():
    def build(c, x, g):
        return c.new_op(ggopt.F32, x.ne, Op.UNARY_BACK, (x, g), UnaryOp.STEP)

    with pytest.raises(InvalidValueError, match="STEP"):
        compute(numpy_backend(), build, [np.zeros(3, F32), np.zeros(3, F32)])
