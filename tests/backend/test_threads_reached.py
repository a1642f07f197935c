"""The sizes that tests present as "above the parallel threshold" really start a second thread.

Each case runs once with a thread count larger than any OpenMP team parked in the process
(see tests/support/threadcheck.py) and must create an OS thread; a kernel's serial/parallel
choice does not depend on the count beyond 1, so the 2-thread variants of those tests run in
parallel too.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt._kernels import _ce_ids, _copy, _gemm, _get_rows, _thin
from ggopt._kernels import _conv as C
from ggopt._kernels import _elementwise as E
from ggopt._kernels import _gather as G
from ggopt._kernels import _optim as O
from ggopt._kernels import _pool as P
from ggopt._kernels import _reduce as R
from ggopt._kernels import _softmax as S
from tests.support.helpers import adamw_params, run
from tests.support.sizes import KERNEL_BIG, LARGE, LARGE_BY_5, LARGE_CE, LARGE_TALL, OPTIM_SIZES
from tests.support.threadcheck import threads_started


def _f32(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(0.5, 2.0, shape).astype(np.float32)


TALL, BY5, CE = LARGE_TALL, LARGE_BY_5, LARGE_CE

# tests/ops' large cases, one op per graph: (build, input shapes)
GRAPH_CASES = {
    "add_row_broadcast": (ggopt.add, [LARGE, (1, LARGE[1])]),
    "div": (ggopt.div, [LARGE, LARGE]),
    "sqr": (ggopt.sqr, [LARGE]),          # a cheap unary op: counts 1 per element
    "exp": (ggopt.exp, [LARGE]),
    "scale": (lambda c, t: ggopt.scale(c, t, 0.5), [LARGE]),
    "sum": (ggopt.sum, [TALL]),
    "sum_rows": (ggopt.sum_rows, [LARGE]),
    "mean": (ggopt.mean, [LARGE]),
    "repeat": (ggopt.repeat, [(1, 5), BY5]),
    "repeat_back": (lambda c, a, b: ggopt.repeat_back(c, b, a), [(1, 5), BY5]),
    "soft_max": (ggopt.soft_max, [LARGE]),
    "cross_entropy_loss": (ggopt.cross_entropy_loss, [CE, CE]),
    "cross_entropy_loss_back": (
        lambda c, g, x, y: ggopt.cross_entropy_loss_back(c, g, x, y), [(1,), CE, CE]),
}


@pytest.mark.parametrize("case", list(GRAPH_CASES))
def test_ops_forward_large_cases_start_a_thread(case):
    build, shapes = GRAPH_CASES[case]
    arrays = [_f32(*s) for s in shapes]
    assert threads_started(lambda n: run(build, *arrays, n_threads=n)) >= 1


def _dst(shape):
    return np.zeros(shape, np.float32)


BIG = KERNEL_BIG  # the size of tests/kernels' threaded cases
N_OPTIM = max(OPTIM_SIZES)

KERNEL_CASES = {
    "binary": lambda n: E.binary(E.BIN_ADD, _f32(*BIG), _f32(1, 1, 1, BIG[3]), _dst(BIG), n),
    "binary_same_shape": lambda n: E.binary(E.BIN_MUL, _f32(*BIG), _f32(*BIG), _dst(BIG), n),
    "unary_neg": lambda n: E.unary(E.UN_NEG, _f32(*BIG), _dst(BIG), n),
    "unary_back_relu": lambda n: E.unary_back(E.UN_RELU, _f32(*BIG), _f32(*BIG), _dst(BIG), n),
    "scale": lambda n: E.scale(_f32(*BIG), _dst(BIG), 2.0, 0.0, n),
    "sum_all": lambda n: R.sum_all(_f32(*BIG), n),
    "sum_rows": lambda n: R.sum_rows(_f32(*BIG), _dst(BIG[:3] + (1,)), n),
    "soft_max": lambda n: S.soft_max(_f32(*BIG), _dst(BIG), 1.0, n),
    "adamw_step": lambda n: O.adamw_step(
        _f32(N_OPTIM), _f32(N_OPTIM), _dst(N_OPTIM), _dst(N_OPTIM),
        adamw_params(1e-3, 0.9, 0.999, 1e-8, 0.1, 1), n),
    "sgd_step": lambda n: O.sgd_step(_f32(N_OPTIM), _f32(N_OPTIM),
                                     np.array([0.05, 0.01], np.float32), n),
}


MNIST_CONV = (3, 3, 1, 1, 1, 1, 1, 1)  # 3x3, stride 1, pad 1


def _idx(high: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, high, shape).astype(np.int32)


# The largest cases of tests/kernels/test_conv, _get_rows, _gather, _copy (their own thresholds).
KERNEL_CASES.update({
    "im2col": lambda n: C.im2col(_f32(20, 8, 14, 14), _dst((20, 14, 14, 72)), *MNIST_CONV, n),
    "im2col_back": lambda n: C.im2col_back(_f32(9, 14, 14, 72), _dst((9, 8, 14, 14)),
                                           *MNIST_CONV, n),
    "pool_2d": lambda n: P.pool_2d(_f32(8, 6, 24, 31), _dst((8, 6, 12, 15)), P.POOL_MAX,
                                   2, 2, 2, 2, 0, 0, n),
    "pool_2d_back": lambda n: P.pool_2d_back(_f32(8, 6, 12, 15), _f32(8, 6, 24, 31),
                                             _dst((8, 6, 24, 31)), P.POOL_MAX, 2, 2, 2, 2, 0, 0,
                                             n),
    "get_rows": lambda n: _get_rows.get_rows(_f32(2, 2, 300, 70), _idx(300, 2, 2, 250),
                                             _dst((2, 2, 250, 70)), n),
    "get_rows_back": lambda n: _get_rows.get_rows_back(_f32(500, 129), _idx(8, 500),
                                                       _dst((8, 129)), n),
    "gather_shards": lambda n: G.gather_shards(
        np.zeros(2000 * 3136, np.uint8), np.zeros(500 * 3136, np.uint8),
        np.random.default_rng(2).permutation(2000).astype(np.int64), 0, 500, 3136, n),
    "copy_permuted": lambda n: _copy.copy(_f32(5, 7, 33, 65).transpose(1, 2, 0, 3),
                                          _dst((7, 33, 5, 65)), n),
    "gemm_one_token": lambda n: _one_token_product(200_000, 16, n),  # 98 blocks of 2048
    "thin_product": lambda n: _thin_product(8, 4096, 1024, n),  # 64 blocks: any fresh team
    # tests/kernels/test_ce_ids's tall and wide cases
    "cross_entropy_loss_ids": lambda n: _ce_ids.cross_entropy_loss_ids(
        _f32(257, 10), _idx(10, 257), -100, n),
    "cross_entropy_loss_ids_back": lambda n: _ce_ids.cross_entropy_loss_ids_back(
        1.0, _f32(5, 4099), _idx(4099, 5), _dst((5, 4099)), -100, n),
})


def _one_token_product(c: int, k: int, n: int) -> None:
    """A one-row product on GemmPlan's dot-product path: ``(1, k) @ (c, k).T``."""
    plan = _gemm.GemmPlan()
    assert plan.add(_f32(1, k), _f32(c, k).T, _dst((1, c)))
    assert plan.n_dot == 1
    plan.run(n)


def _thin_product(r: int, k: int, c: int, n: int) -> None:
    """A rank-``r`` product on ThinPlan (LoRA's ``A x`` shape), above its parallel threshold."""
    plan = _thin.ThinPlan()
    assert plan.add(_f32(r, k), _f32(k, c), _dst((r, c)))
    plan.run(n)


@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernel_big_cases_start_a_thread(case):
    call = KERNEL_CASES[case]
    assert threads_started(lambda n: call(n)) >= 1


def test_the_probe_sees_a_serial_call():
    small = (1, 1, 1, 1000)
    assert threads_started(lambda n: E.unary(E.UN_NEG, _f32(*small), _dst(small), n)) == 0


def test_a_small_one_token_product_stays_on_one_thread():
    """Below DOT_PARALLEL_MIN_ELEMENTS (an attention head's products) no thread is woken."""
    assert threads_started(lambda n: _one_token_product(200, 64, n)) == 0
