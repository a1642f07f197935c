"""The optimization's state as one object: OptContext.state(), stage_load()/load() of a
Snapshot, locked()/abandon(), and the Staging transaction they are built on."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ggopt.backend import tensor_get
from ggopt.errors import DTypeError, ShapeError, StateError
from ggopt.io.staging import Staging
from ggopt.opt.checkpoint_file import read_file
from ggopt.opt.state import Counters
from tests.support import tiny_ckpt as tiny


def test_staging_changes_nothing_until_commit_and_commits_once():
    target = {"a": 0, "b": 0}
    s = Staging("here")
    s.array(np.zeros((2, 3), np.float32), (2, 3), np.dtype(np.float32), "field a")
    s.change(lambda: target.__setitem__("a", 1))
    s.change(lambda: target.__setitem__("b", 2))
    assert target == {"a": 0, "b": 0}
    s.commit()
    assert target == {"a": 1, "b": 2}
    with pytest.raises(StateError, match="already committed"):
        s.commit()
    with pytest.raises(StateError, match="already committed"):
        s.change(lambda: None)


def test_staging_checks_arrays_and_names_the_field():
    s = Staging("file x")
    with pytest.raises(ShapeError, match=r"file x: f: expected ggml shape \[3, 2\], the file "
                                         r"has \[2, 2\]"):
        s.array(np.zeros((2, 2), np.float32), (2, 3), np.dtype(np.float32), "f")
    with pytest.raises(DTypeError, match="file x: f: expected F32, the file has int32"):
        s.array(np.zeros((2, 3), np.int32), (2, 3), np.dtype(np.float32), "f", "F32")
    with pytest.raises(ShapeError, match="file x: f is missing"):
        s.array(None, (2, 3), np.dtype(np.float32), "f")


def test_commit_returns_the_undo_of_changes_that_have_one():
    log = []
    s = Staging("here")
    s.change(lambda: log.append("a") or (lambda: log.append("undo a")))
    s.change(lambda: log.append("b"))
    s.change(lambda: log.append("c") or (lambda: log.append("undo c")))
    undo = s.commit()
    undo()
    assert log == ["a", "b", "c", "undo c", "undo a"]


def test_state_view_and_load_of_a_snapshot(tmp_path):
    good = tiny.save(tmp_path / "good.gguf", range(3))
    snap = read_file(good).snapshot
    assert snap.counters == Counters(iteration=2, opt_i=1, period_complete=False)
    ctx, x, _, w, keep = tiny.context(tiny.schedule())
    with ctx:
        view = ctx.state()
        assert view.built and not view.pending and view.params == (w,)
        assert set(view.param_accs) == {w} and set(view.moments) == {w}
        assert view.counters == Counters() and view.rng is ctx.rng
        ctx.load(snap)
        assert ctx.state().counters == snap.counters
        assert tensor_get(w).tobytes() == snap.params["w"].tobytes()
        m, v = ctx.state().moments[w]
        assert tensor_get(m).tobytes() == snap.moments["w"][0].tobytes()
        assert tensor_get(v).tobytes() == snap.moments["w"][1].tobytes()
        assert list(ctx.rng.get_state()) == list(snap.rng)
    del keep


def test_locked_holds_the_scheduler_and_the_context_and_abandon_drops_an_alloc():
    ctx, x, _, w, keep = tiny.context()
    ds = tiny.dataset()
    with ctx:
        ds.get_batch(x, ctx.labels, 0)
        ctx.alloc(True)
        assert ctx.eval_pending
        ctx.abandon()
        assert not ctx.eval_pending
        ctx.alloc(True)  # works again
        ctx.eval(None)
        ctx.abandon()  # no alloc pending: nothing to drop
        got = []
        with ctx.locked():
            t = threading.Thread(target=lambda: got.append(ctx.state().counters.opt_i))
            t.start()
            t.join(0.2)
            assert t.is_alive() and not got  # the other thread waits for the locks
        t.join()
        assert got == [1]
    del keep
