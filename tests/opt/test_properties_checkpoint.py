"""Checkpoint fuzzer: mutated or truncated checkpoint files are refused with nothing changed
(a GgoptError, the context, dataset and schedule exactly as before), or loaded faithfully
(the state the intact file gives). Examples: the hypothesis profile (tests/conftest.py),
thousands with ``GGOPT_HYPOTHESIS_PROFILE=fuzz``."""

from __future__ import annotations

import pytest

from tests.support import tiny_ckpt as tiny

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ggopt import GgoptError  # noqa: E402


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` with 1-4 edits: bytes set, a 4/8-byte field set to an extreme, a cut, an
    insertion or an append."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "set", "field", "truncate", "insert", "append"]))
        if kind == "set" and buf:
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
        elif kind == "field" and buf:
            i = draw(st.integers(0, len(buf) - 1))
            width = draw(st.sampled_from([4, 8]))
            buf[i:i + width] = draw(st.sampled_from([b"\x00", b"\xff", b"\x7f"])) * width
        elif kind == "truncate":
            del buf[draw(st.integers(0, len(buf))):]
        elif kind == "insert":
            i = draw(st.integers(0, len(buf)))
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            buf += draw(st.binary(min_size=1, max_size=16))
    return bytes(buf)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    return tiny.save(d / "good.gguf", range(3)), tiny.save(d / "other.gguf", [0], False), d




def test_checkpoint_fuzz(files):
    good, other, d = files
    sched, ds = tiny.schedule(), tiny.dataset()
    ctx, x, _, w, keep = tiny.context(sched)
    ctx.load_state(good, ds)
    loaded = tiny.state(ctx, ds, sched)  # what the intact file gives
    ctx.load_state(other, ds)
    start = tiny.state(ctx, ds, sched)  # a different state to start every example from
    assert start != loaded
    path = d / "mutated.gguf"

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow], deadline=None)
    @given(mutated(good.read_bytes()))
    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            ctx.load_state(path, ds)
        except GgoptError:
            assert tiny.state(ctx, ds, sched) == start  # refused: nothing changed
            return
        assert tiny.state(ctx, ds, sched) == loaded  # accepted: loaded faithfully
        ctx.load_state(other, ds)

    try:
        check()
    finally:
        ctx.close()
        del keep
