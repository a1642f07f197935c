"""Recomputed activations (``backend/recompute.py``): a cheap node read again far later is run
a second time there instead of being held; the results keep their bits and the compute memory
shrinks."""

from __future__ import annotations

import dataclasses

import pytest

import ggopt
from ggopt import backend as gb
from ggopt.backend import sched as sched_module
from ggopt.backend.recompute import recomputable
from ggopt.lm import lora
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.tensor import Op
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
        copies = net.sched._current.recomputed
        assert all(c.op is Op.GLU for c in copies)
        size = net.sched.get_buffer_size(net.sched.backends[0])
        loss = ft.validate().loss
        params = [t.numpy().tobytes() for t in ft.trainable()]
        ft.close()
    return params, loss, size, len(copies), len(compiled)


@pytest.mark.parametrize("static, rank, n_copies", [
    (True, 4, CFG4.n_layer - 1), (False, 4, CFG4.n_layer - 1), (False, 0, CFG4.n_layer - 1),
    (True, 0, 0)], ids=["lora-static", "lora-dynamic", "full-dynamic", "full-static"])
def test_a_fine_tune_recomputes_its_glus_with_the_same_bits_in_less_memory(
        static, rank, n_copies, monkeypatch):
    """Every layer's GLU but the last one's (whose backward follows within MIN_GAP nodes) is
    recomputed, with the same bits, where that makes the compute memory smaller: not in the
    full static step, whose copies would fragment the free space (its plan grows). Dynamic
    graphs still share their compiled plans (as few compiles as without copies)."""
    params, loss, size, copies, compiled = _fine_tune(static, rank, True, monkeypatch)
    params0, loss0, size0, copies0, compiled0 = _fine_tune(static, rank, False, monkeypatch)
    assert copies0 == 0 and copies == n_copies and compiled == compiled0 <= 3
    assert params == params0 and loss == loss0
    assert size < size0 if n_copies else size == size0


def _chain(variant: str = ""):
    """``h = swiglu_split(p, q)`` read at once and again after 12 nodes, ``p`` and ``q`` read
    at the end (held anyway); ``variant`` breaks one condition. Returns (nodes, h)."""
    ctx_w, ctx = ggopt.Context(), ggopt.Context()
    w1, w2 = ctx_w.new_tensor_1d(F32, 8), ctx_w.new_tensor_1d(F32, 8)
    gb.alloc_ctx_tensors(ctx_w, gb.cpu_init())
    p, q = ggopt.add(ctx, w1, w2), ggopt.mul(ctx, w1, w2)
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
    assert recomputable(nodes, min_gap=8) == {h: nodes.index(late)}
    assert recomputable(nodes, min_gap=20) == {}  # the gap is 14 nodes


@pytest.mark.parametrize("variant", ["output", "written", "source written", "source dies"])
def test_a_node_is_held_when_recomputing_it_would_be_wrong_or_cost_memory(variant):
    """A graph output (its memory is read after the compute), a node or source written in
    place between the reads (a copy would read other values), a source not held until the
    late read (the copy would keep it alive)."""
    nodes, h, _ = _chain(variant)
    assert h not in recomputable(nodes, min_gap=8)
