"""NodeTimes (``backend/profile.py``): each step of a graph compiled while it is active is timed
under its nodes; outside it nothing is recorded."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.backend.profile import NodeTimes
from ggopt.errors import StateError


def _graph():
    ctx_static, ctx = ggopt.Context(), ggopt.Context()
    a, b = ctx_static.new_tensor_2d(ggopt.F32, 64, 32), ctx_static.new_tensor_2d(ggopt.F32, 64, 16)
    sched = gb.Scheduler([gb.cpu_init()])
    gb.alloc_ctx_tensors(ctx_static, sched.backends[0])
    gb.tensor_set(a, np.ones((32, 64), np.float32))
    gb.tensor_set(b, np.ones((16, 64), np.float32))
    other = ggopt.sqr(ctx, ggopt.mul_mat(ctx, a, b))
    out = ggopt.add(ctx, other, ggopt.mul_mat(ctx, a, b))  # fused: product and add
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    return sched, g, out


def test_steps_are_timed_under_their_nodes():
    sched, g, out = _graph()
    with NodeTimes() as rec:
        sched.alloc_graph(g)
        sched.graph_compute(g)
        sched.graph_compute(g)
    ops = [tuple(n.op.name for n in st.nodes) for st in rec.steps]
    assert ops == [("MUL_MAT",), ("SQR",), ("MUL_MAT", "ADD")]
    assert all(st.calls == 2 and st.seconds > 0 for st in rec.steps)
    assert rec.total() == pytest.approx(sum(st.seconds for st in rec.steps))
    np.testing.assert_array_equal(gb.tensor_get(out), np.full((16, 32), 64.0 ** 2 + 64.0))
    sched.graph_compute(g)  # after the recorder closed: runs, records nothing
    assert all(st.calls == 2 for st in rec.steps)
    rec.clear()
    assert rec.total() == 0.0 and len(rec.steps) == 3


def test_one_recorder_at_a_time_and_none_outside():
    with NodeTimes(), pytest.raises(StateError, match="another recorder"):
        with NodeTimes():
            pass
    sched, g, _ = _graph()
    rec = NodeTimes()
    sched.alloc_graph(g)
    sched.graph_compute(g)
    assert rec.steps == []
