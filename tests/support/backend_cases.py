"""The op table of the multi-backend tests: one OpCase per op and layout (inputs, build), the
comparison of a backend's result with the CPU's, and the small MLP/CNN training graphs that
tests/backend/test_multi.py and tests/backend/test_cupy.py run on each backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

import ggopt
from ggopt import backend as gb
from ggopt import opt
from ggopt.tensor import Op, UnaryOp
from tests.support.helpers import new_tensor

F32 = np.float32


POOL_MAX, POOL_AVG = ggopt.OP_POOL_MAX, ggopt.OP_POOL_AVG


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
        OpCase("cross_entropy_loss_ids", ggopt.cross_entropy_loss_ids,
               lambda r: [_u(r, 2, 4, 10, lo=-5, hi=5), _ids(r, 10, 2, 4)]),
        OpCase("cross_entropy_loss_ids_back", ggopt.cross_entropy_loss_ids_back,
               lambda r: [np.array([1.7], F32), _u(r, 8, 10, lo=-5, hi=5), _ids(r, 10, 8)]),
    ]


def _ids(r: np.random.Generator, ncls: int, *shape: int) -> np.ndarray:
    """Class ids, about a quarter of them -100 (ignored)."""
    ids = r.integers(0, ncls, shape).astype(np.int32)
    ids[r.random(shape) < 0.25] = -100
    return ids


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
