"""The scheduler's plans shared by graph signature: a fresh graph of a known structure takes the
plan compiled before; any difference in shape, op, parameters, flags, views, sources or fixed
memory compiles anew; results are the same bits either way."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.backend.array.backend import numpy_backend
from ggopt.backend.plan_cache import PlanCache, graph_signature

Build = Callable[[ggopt.Context, ggopt.Tensor, ggopt.Tensor], ggopt.Tensor]


class Fixture:
    """Inputs ``x`` and a weight ``w`` with fixed memory, and a scheduler that counts
    compilations."""

    def __init__(self, plan_cache: int = 8, backends: list[gb.Backend] | None = None) -> None:
        self.ctx = ggopt.Context()
        self.x = ggopt.set_name(self.ctx.new_tensor_2d(ggopt.F32, 8, 6), "x")
        self.w = ggopt.set_name(self.ctx.new_tensor_2d(ggopt.F32, 8, 6), "w")
        self.w2 = ggopt.set_name(self.ctx.new_tensor_2d(ggopt.F32, 8, 6), "w2")
        ggopt.set_input(self.x)
        cpu = gb.cpu_init()
        gb.alloc_ctx_tensors(self.ctx, cpu)
        rng = np.random.default_rng(0)
        for t in (self.x, self.w, self.w2):
            gb.tensor_set(t, rng.standard_normal(48).astype(np.float32))
        self.sched = gb.Scheduler((backends or []) + [cpu], plan_cache=plan_cache)
        self.compiles = 0
        compile_ = self.sched._compile

        def counting(g: ggopt.Graph):  # type: ignore[no-untyped-def]
            self.compiles += 1
            return compile_(g)

        self.sched._compile = counting  # type: ignore[method-assign]


def compute(f: Fixture, build: Build, w: ggopt.Tensor | None = None) -> np.ndarray:
    """Build a fresh graph with ``build``, allocate and compute it on ``f``'s scheduler."""
    ctx = ggopt.Context()
    out = build(ctx, f.x, f.w if w is None else w)
    ggopt.set_output(out)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    f.sched.reset()
    f.sched.alloc_graph(g)
    f.sched.graph_compute(g)
    return gb.tensor_get(out)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def fresh(build: Build, w_name: str = "w") -> np.ndarray:
    """The same computation on a scheduler that never shares plans."""
    f = Fixture(plan_cache=0)
    return compute(f, build, getattr(f, w_name))


def base(ctx: ggopt.Context, x: ggopt.Tensor, w: ggopt.Tensor) -> ggopt.Tensor:
    h = ggopt.mul(ctx, ggopt.add(ctx, x, w), w)
    return ggopt.sum_rows(ctx, ggopt.scale(ctx, ggopt.sqr(ctx, h), 0.5))


# Graphs that differ from ``base`` in one thing each; every one must compile anew.
VARIANTS: dict[str, Build] = {
    "op": lambda c, x, w: ggopt.sum_rows(c, ggopt.scale(c, ggopt.sqr(
        c, ggopt.mul(c, ggopt.sub(c, x, w), w)), 0.5)),
    "param value": lambda c, x, w: ggopt.sum_rows(c, ggopt.scale(c, ggopt.sqr(
        c, ggopt.mul(c, ggopt.add(c, x, w), w)), 0.25)),
    "source order": lambda c, x, w: ggopt.sum_rows(c, ggopt.scale(c, ggopt.sqr(
        c, ggopt.mul(c, ggopt.add(c, w, x), w)), 0.5)),
    "shape": lambda c, x, w: ggopt.sum_rows(c, ggopt.scale(c, ggopt.sqr(c, ggopt.mul(
        c, ggopt.add(c, ggopt.view_2d(c, x, 8, 3, x.nb[1], 0),
                     ggopt.view_2d(c, w, 8, 3, w.nb[1], 0)),
        ggopt.view_2d(c, w, 8, 3, w.nb[1], 0))), 0.5)),
    "view offset": lambda c, x, w: ggopt.sum_rows(c, ggopt.scale(c, ggopt.sqr(c, ggopt.mul(
        c, ggopt.add(c, ggopt.view_2d(c, x, 8, 3, x.nb[1], 0),
                     ggopt.view_2d(c, w, 8, 3, w.nb[1], 0)),
        ggopt.view_2d(c, w, 8, 3, w.nb[1], 3 * w.nb[1]))), 0.5)),
    "view strides": lambda c, x, w: ggopt.sum_rows(c, ggopt.scale(c, ggopt.sqr(c, ggopt.mul(
        c, ggopt.add(c, ggopt.view_2d(c, x, 8, 3, x.nb[1], 0),
                     ggopt.view_2d(c, w, 8, 3, w.nb[1], 0)),
        ggopt.view_2d(c, w, 8, 3, 2 * w.nb[1], 0))), 0.5)),
}


def test_same_structure_shares_the_plan_and_the_bits():
    f = Fixture()
    first = compute(f, base)
    assert f.compiles == 1
    for _ in range(3):
        assert same_bits(compute(f, base), first)
    assert f.compiles == 1
    assert same_bits(first, fresh(base))


@pytest.mark.parametrize("name", VARIANTS)
def test_a_graph_differing_in_one_thing_compiles_anew(name):
    f = Fixture()
    compute(f, base)
    got = compute(f, VARIANTS[name])
    assert f.compiles == 2
    assert same_bits(got, fresh(VARIANTS[name]))
    compute(f, VARIANTS[name])  # now it shares its own plan
    assert f.compiles == 2


def test_scale_by_minus_zero_is_another_plan():
    # 0.0 == -0.0 in Python: the signature compares float parameters by their bits
    f = Fixture()

    def by(s: float) -> Build:
        return lambda c, x, w: ggopt.scale(c, ggopt.add(c, x, w), s)

    compute(f, by(0.0))
    assert same_bits(compute(f, by(-0.0)), fresh(by(-0.0)))
    assert f.compiles == 2


def test_another_weight_or_an_output_flag_compiles_anew():
    f = Fixture()
    compute(f, base)
    got = compute(f, base, f.w2)  # same shapes, other fixed memory
    assert f.compiles == 2
    assert same_bits(got, fresh(base, "w2"))

    def flagged(c: ggopt.Context, x: ggopt.Tensor, w: ggopt.Tensor) -> ggopt.Tensor:
        h = ggopt.add(c, x, w)
        ggopt.set_output(h)  # kept alive: the memory plan differs
        return ggopt.sum_rows(c, ggopt.scale(c, ggopt.sqr(c, ggopt.mul(c, h, w)), 0.5))

    assert same_bits(compute(f, flagged), fresh(flagged))
    assert f.compiles == 3


def test_a_weight_moved_to_other_memory_compiles_anew():
    f = Fixture()
    first = compute(f, base)
    data = gb.tensor_get(f.w)
    f.w.buffer = None
    gb.alloc_ctx_tensors(f.ctx, f.sched.get_backend(0))  # w gets a new buffer
    gb.tensor_set(f.w, data)
    assert same_bits(compute(f, base), first)
    assert f.compiles == 2


def test_buffer_growth_drops_every_shared_plan():
    f = Fixture()
    small = compute(f, base)

    def big(c: ggopt.Context, x: ggopt.Tensor, w: ggopt.Tensor) -> ggopt.Tensor:
        y = ggopt.mul_mat(c, ggopt.repeat(c, x, c.new_tensor_2d(ggopt.F32, 8, 600)), w)
        return ggopt.sum_rows(c, y)

    compute(f, big)
    assert f.compiles == 2 and len(f.sched._plans) == 1  # the small plan pointed elsewhere
    assert same_bits(compute(f, base), small)
    assert f.compiles == 3


def test_plans_with_copies_between_backends_are_not_shared():
    f = Fixture(backends=[numpy_backend(ops={ggopt.Op.ADD})])
    first = compute(f, base)
    assert f.sched.get_n_copies() > 0
    assert same_bits(compute(f, base), first)
    assert f.compiles == 2 and len(f.sched._plans) == 0


def test_unknown_op_params_have_no_signature():
    ctx = ggopt.Context()
    x = ctx.new_tensor_1d(ggopt.F32, 4)
    y = ggopt.scale(ctx, x, 2.0)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, y)
    assert graph_signature(g) is not None
    y.op_params = [2.0]
    assert graph_signature(g) is None


def test_without_a_cache_every_new_graph_compiles():
    f = Fixture(plan_cache=0)
    compute(f, base)
    compute(f, base)
    assert f.compiles == 2


def test_cache_keeps_the_most_recent_plans():
    cache: PlanCache[str] = PlanCache(2)
    cache.put((1,), "a")
    cache.put((2,), "b")
    assert cache.get((1,)) == "a"  # now the most recent
    cache.put((3,), "c")
    assert cache.get((2,)) is None and cache.get((1,)) == "a" and len(cache) == 2


@pytest.mark.parametrize("bad, error", [(-1, ggopt.InvalidValueError),
                                        (1.5, ggopt.DTypeError), (True, ggopt.DTypeError),
                                        ("8", ggopt.DTypeError)])
def test_plan_cache_size_is_checked(bad, error):
    with pytest.raises(error, match="plan_cache"):
        gb.Scheduler([gb.cpu_init()], plan_cache=bad)


def test_dynamic_training_is_the_same_bits_with_and_without_shared_plans():
    from ggopt.cli.llm import default_corpus_paths, read_corpus
    from ggopt.lm import FinetuneParams, FineTuner, text_windows
    from ggopt.models import llama

    cfg = llama.Config(n_ctx=16, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48)
    text = read_corpus(default_corpus_paths()[:1])[:3000]
    weights, compiles = [], []
    for size in (0, 8):
        f = Fixture(plan_cache=size)  # only for its counting scheduler
        m = llama.build_model(cfg, f.sched)
        llama.set_weights(m, llama.init_weights(cfg, 3), "test")
        tuner = FineTuner(m, text_windows(list(text), cfg.n_ctx, 8),
                          FinetuneParams(n_batch=4, n_ubatch=2, lr=3e-3, static=False))
        tuner.fit(2)
        tuner.close()
        weights.append(llama.get_weights(m))
        compiles.append(f.compiles)
    for name in weights[0]:
        assert same_bits(weights[0][name], weights[1][name]), name
    # gradient, optimizer and validation graphs: compiled once each with shared plans (the very
    # first graph once more: its accumulator views had no memory yet when it was built)
    assert compiles[1] <= 4 < compiles[0]
