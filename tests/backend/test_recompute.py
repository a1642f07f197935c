"""Recomputed activations (``backend/recompute.py``): a cheap node read again far later is run
a second time there instead of being held; the results keep their bits and the compute memory
shrinks."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

import ggopt
from ggopt import backend as gb
from ggopt.backend import sched as sched_module
from ggopt.backend.recompute import plan_recompute, recomputable
from ggopt.lm import lora
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.types import F32
from tests.support.finetune import CFG, tiny, windows

CFG4 = dataclasses.replace(CFG, n_layer=4, n_ff=256)  # GLUs of 16 KB: most of the memory


def _fine_tune(static: bool, rank: int, enabled: bool, monkeypatch
               ) -> tuple[list[bytes], float, int, int, int]:
    """Four steps of a tiny llama's fine-tune (LoRA of ``rank``, or full at 0): (the trained
    parameters' bytes, the validation loss, the compute memory, how many nodes were
    recomputed, how many graphs were compiled)."""
    compiled = []
    compile_graph = sched_module.Scheduler._compile
    with monkeypatch.context() as m:
        m.setattr(sched_module.Scheduler, "_compile",
                  lambda self, g: compiled.append(g) or compile_graph(self, g))
        if not enabled:
            m.setattr(sched_module, "plan_recompute", lambda nodes, leafs, ctx: None)
        net = tiny(CFG4)
        if rank:
            lora.attach(net, lora.create(net, rank, 2.0 * rank, seed=0))
        ft = FineTuner(net, windows(8), FinetuneParams(val_split=0.25, static=static))
        for i in range(4):
            ft.microbatch(i % ft.n_train_mb, True, 1.0)
        copies = Counter(c.op.name for c, _, _ in net.sched._current.recomputed)
        size = net.sched.get_buffer_size(net.sched.backends[0])
        loss = ft.validate().loss
        params = [t.numpy().tobytes() for t in ft.trainable()]
        ft.close()
    return params, loss, size, copies, len(compiled)


LORA = {"GLU": 3, "RMS_NORM": 6, "MUL": 6}  # 3 of 4 layers: the GLU, both mul(norm(x), w)
FULL = {"GLU": 3, "RMS_NORM": 7}  # the norms, read by their weights' gradients (and the last)


@pytest.mark.parametrize("static, rank, expected", [
    (True, 4, LORA), (False, 4, LORA), (False, 0, FULL), (True, 0, {})],
    ids=["lora-static", "lora-dynamic", "full-dynamic", "full-static"])
def test_a_fine_tune_recomputes_activations_with_the_same_bits_in_less_memory(
        static, rank, expected, monkeypatch):
    """The layers' GLUs and norms (with LoRA, the normalized inputs of the projections, from
    the residual) are recomputed, except the last layer's (whose backward follows within
    MIN_GAP nodes), with the same bits, where that makes the compute memory smaller: not in the
    full static step, whose copies would fragment the free space (its plan grows). Dynamic
    graphs still share their compiled plans (as few compiles as without copies)."""
    params, loss, size, copies, compiled = _fine_tune(static, rank, True, monkeypatch)
    params0, loss0, size0, copies0, compiled0 = _fine_tune(static, rank, False, monkeypatch)
    assert not copies0 and copies == expected and compiled == compiled0 <= 3
    assert params == params0 and loss == loss0
    assert size < size0 if expected else size == size0


def _chain(variant: str = ""):
    """``h = swiglu_split(p, q)`` read at once and again after 12 nodes, ``p`` and ``q`` read
    at the end (held anyway); ``variant`` breaks one condition. Returns (nodes, h)."""
    ctx_w, ctx = ggopt.Context(), ggopt.Context()
    w1, w2 = ctx_w.new_tensor_1d(F32, 8), ctx_w.new_tensor_1d(F32, 8)
    gb.alloc_ctx_tensors(ctx_w, gb.cpu_init())
    p, q = ggopt.add(ctx, w1, w2), ggopt.sub(ctx, w1, w2)  # not recomputed themselves
    h = ggopt.swiglu_split(ctx, p, q)
    if variant == "output":
        ggopt.set_output(h)
    f = ggopt.scale(ctx, h, 2.0)
    for _ in range(12):
        f = ggopt.scale(ctx, f, 0.5)
    if variant == "written":
        f = ggopt.add(ctx, f, ggopt.add_inplace(ctx, h, f))
    if variant == "source written":
        f = ggopt.add(ctx, f, ggopt.add_inplace(ctx, p, f))
    late = ggopt.mul(ctx, h, f)
    held = ggopt.add(ctx, p, q) if variant != "source dies" else ggopt.add(ctx, w1, q)
    out = ggopt.add(ctx, late, held)
    ggopt.set_output(out)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    return g.nodes, h, late


def test_a_cheap_node_read_again_late_is_recomputed_before_that_reader():
    nodes, h, late = _chain()
    assert recomputable(nodes, min_gap=8) == {h: (nodes.index(late), [h])}
    assert recomputable(nodes, min_gap=20) == {}  # the gap is 14 nodes


@pytest.mark.parametrize("x_held", [True, False])
def test_a_source_not_held_is_recomputed_too_from_held_ones(x_held):
    """``mul(rms_norm(x), w)`` read again late: its norm is not held, so it is recomputed
    first, from ``x`` if ``x`` is held there (read late too); otherwise nothing is."""
    ctx_w, ctx = ggopt.Context(), ggopt.Context()
    x, w = ctx_w.new_tensor_2d(F32, 8, 4), ctx_w.new_tensor_1d(F32, 8)
    wide = ctx_w.new_tensor_2d(F32, 8, 256)
    gb.alloc_ctx_tensors(ctx_w, gb.cpu_init())
    xs = ggopt.scale(ctx, x, 3.0)  # no memory of its own
    n = ggopt.rms_norm(ctx, xs, 1e-5)
    h = ggopt.mul(ctx, n, w)
    f = ggopt.scale(ctx, h, 2.0)
    # the peak between the reads: 8 KB, while h is held (so the copies save memory)
    f = ggopt.add(ctx, f, ggopt.sum(ctx, ggopt.repeat(ctx, f, wide)))
    for _ in range(12):
        f = ggopt.scale(ctx, f, 0.5)
    late = ggopt.mul(ctx, h, f)
    out = ggopt.add(ctx, late, xs if x_held else f)
    ggopt.set_output(out)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    got = recomputable(g.nodes, min_gap=8)
    assert got == ({h: (g.nodes.index(late), [n, h])} if x_held else {})
    redo = plan_recompute(g.nodes, g.leafs, ggopt.Context(), min_gap=8)
    if x_held:  # the copies run before the late read, the second reading the first
        assert redo is not None and redo.copies == redo.nodes[g.nodes.index(late):][:2]
        n2, h2 = redo.copies
        assert (n2.op, n2.src, h2.op, h2.src) == (n.op, n.src, h.op, (n2, w))
        assert redo.sources == {late: (h2, f)}
    else:
        assert redo is None


@pytest.mark.parametrize("variant", ["output", "written", "source written", "source dies"])
def test_a_node_is_held_when_recomputing_it_would_be_wrong_or_cost_memory(variant):
    """A graph output (its memory is read after the compute), a node or source written in
    place between the reads (a copy would read other values), a source not held until the
    late read (the copy would keep it alive)."""
    nodes, h, _ = _chain(variant)
    assert h not in recomputable(nodes, min_gap=8)
