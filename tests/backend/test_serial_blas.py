"""backend.blas.SerialBlas: BLAS on one thread while any scheduler computes, restored after the
last one, whichever Python thread they run on."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import threadpoolctl

import ggopt
from ggopt import backend as gb
from ggopt.backend.cpu.blas import SerialBlas


def blas_threads() -> list[int]:
    """The thread counts of the threaded BLAS libraries (oneMKL on its sequential layer, as
    ggopt's products load it, always runs on the calling thread)."""
    return [i["num_threads"] for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas" and i.get("threading_layer") != "sequential"]


@pytest.fixture
def two_blas_threads():
    if not blas_threads():
        pytest.skip("threadpoolctl finds no BLAS library in this NumPy")
    ggopt.set_n_threads(2)
    yield
    ggopt.set_n_threads(None)


def test_overlapping_guards_restore_only_after_the_last(two_blas_threads):
    a, b = SerialBlas(), SerialBlas()
    assert set(blas_threads()) == {2}
    a.__enter__()
    b.__enter__()
    assert set(blas_threads()) == {1}
    a.__exit__(None, None, None)  # b still computes: BLAS stays on one thread
    assert set(blas_threads()) == {1}
    b.__exit__(None, None, None)
    assert set(blas_threads()) == {2}


def test_guard_restores_when_a_step_raises(two_blas_threads):
    with pytest.raises(RuntimeError), SerialBlas():
        raise RuntimeError("a failing step")
    assert set(blas_threads()) == {2}


def _model() -> tuple[gb.Scheduler, ggopt.Graph, ggopt.Tensor, np.ndarray]:
    ctx = ggopt.Context(no_alloc=False)
    rng = np.random.default_rng(0)
    a, b = ctx.new_tensor_2d(ggopt.F32, 64, 64), ctx.new_tensor_2d(ggopt.F32, 64, 64)
    a.numpy()[:] = rng.standard_normal((64, 64), dtype=np.float32)
    b.numpy()[:] = rng.standard_normal((64, 64), dtype=np.float32)
    out = ggopt.mul_mat(ctx, a, b)
    ggopt.set_output(out)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    return gb.Scheduler([gb.cpu_init()]), g, out, b.numpy() @ a.numpy().T


def test_two_schedulers_on_two_threads(two_blas_threads):
    models = [_model() for _ in range(2)]
    errors: list[BaseException] = []

    def run(sched: gb.Scheduler, g: ggopt.Graph, out: ggopt.Tensor, want: np.ndarray) -> None:
        try:
            for _ in range(50):
                sched.graph_compute(g)
                np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=m) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(blas_threads()) == {2}  # the last compute out restored the setting
