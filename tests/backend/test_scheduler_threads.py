"""A scheduler shared between threads: its lock serialises computes, without it a race is refused
rather than silently wrong, and opt contexts train from two threads.
"""

from __future__ import annotations

import math
import threading

import ggopt
from ggopt import (
    StateError,
    opt,
)
from ggopt import backend as gb
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data


def _shared_scheduler_model():
    ctx_static = ggopt.Context()
    x = ctx_static.new_tensor_1d(ggopt.F32, 4096)
    gb.alloc_ctx_tensors(ctx_static, gb.cpu_init())
    x.numpy()[:] = 1.0
    graphs = []
    for s in (2.0, 3.0):
        ctx = ggopt.Context()
        h = ggopt.scale(ctx, x, s)
        for _ in range(6):
            h = ggopt.relu(ctx, ggopt.add(ctx, h, x))
        out = ggopt.sum(ctx, h)
        g = ggopt.new_graph(ctx)
        ggopt.build_forward_expand(g, out)
        graphs.append((g, out, 4096.0 * (s + 6)))
    return graphs


def _run_threads(fn, n=2):
    errors: list[BaseException] = []

    def body(i):
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_scheduler_from_two_threads_serialised_by_its_lock():
    graphs = _shared_scheduler_model()
    sched = gb.Scheduler([gb.cpu_init()])
    wrong = []

    def work(i):
        g, out, want = graphs[i]
        for _ in range(60):
            with sched:
                sched.reset()
                sched.alloc_graph(g)
                sched.graph_compute(g)
                got = float(gb.tensor_get(out)[0])
            if got != want:
                wrong.append((i, got))

    assert _run_threads(work) == []
    assert wrong == []


def test_scheduler_from_two_threads_without_the_lock_never_computes_silently_wrong():
    graphs = _shared_scheduler_model()
    sched = gb.Scheduler([gb.cpu_init()])
    wrong, refused = [], []

    def work(i):
        g, out, want = graphs[i]
        for _ in range(60):
            try:
                sched.reset()
                sched.alloc_graph(g)
                sched.graph_compute(g)
                got = float(gb.tensor_get(out)[0])
            except StateError:
                refused.append(i)
                continue
            if got != want:
                wrong.append((i, got))

    assert _run_threads(work) == []
    assert wrong == []


def _two_contexts_on_one_scheduler(sched):
    out = []
    for _ in range(2):
        cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False, batch_axis=True,
                           nbatch_physical=2, nbatch_logical=2)
        cd.params.backend_sched = sched
        cd.params.get_opt_pars = get_test_opt_pars
        out.append((cd, opt.OptContext(cd.params)))
    return out


def test_two_opt_contexts_sharing_a_scheduler_train_in_two_threads():
    sched = gb.Scheduler([gb.cpu_init()])
    pairs = _two_contexts_on_one_scheduler(sched)
    results = [opt.Result(), opt.Result()]

    def work(i):
        cd, ctx = pairs[i]
        for _ in range(25):
            opt.epoch(ctx, cd.dataset_unsupervised, results[i], None, -1)

    assert _run_threads(work) == []
    # the same training alone, for reference
    ref_cd, ref_ctx = _two_contexts_on_one_scheduler(gb.Scheduler([gb.cpu_init()]))[0]
    ref = opt.Result()
    for _ in range(25):
        opt.epoch(ref_ctx, ref_cd.dataset_unsupervised, ref, None, -1)
    for cd, _ in pairs:
        assert cd.w == ref_cd.w
    for r in results:
        assert r.loss() == ref.loss() and r.ndata == ref.ndata


def test_one_opt_context_from_two_threads():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False, batch_axis=True)
    cd.params.get_opt_pars = get_test_opt_pars
    ctx = opt.OptContext(cd.params)
    # epoch holds the context for its whole run: two threads' epochs are serialised
    assert _run_threads(lambda i: opt.epoch(ctx, cd.dataset_unsupervised, None, None, -1)) == []
    assert cd.w == 3.0 - 12.0
    # an alloc/eval pair belongs to the thread that allocated
    ctx.alloc(True)
    errors = _run_threads(lambda i: ctx.eval(), n=1)
    assert len(errors) == 1 and isinstance(errors[0], StateError)
    assert "thread" in str(errors[0])
    ctx.eval()
    assert cd.w == 3.0 - 13.0
    assert not math.isnan(cd.w)
