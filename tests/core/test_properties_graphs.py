"""Property tests of graphs: views never address memory outside their source tensor, and
random small graphs give the same bits with and without the planner's memory reuse and with
1 or 2 threads.

The number of examples comes from the hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from numpy.lib.array_utils import byte_bounds  # noqa: E402

import ggopt  # noqa: E402
from ggopt import GgoptError  # noqa: E402
from ggopt import backend as gb  # noqa: E402
from ggopt._kernels import _conv  # noqa: E402
from ggopt.backend.cpu.ops import conv_sparse  # noqa: E402

F32 = ggopt.F32

# --- views ---------------------------------------------------------------------------------------

_sizes = st.integers(0, 6)
_strides = st.one_of(st.integers(-64, -1), st.integers(0, 96),
                     st.sampled_from([2**31, 2**40, -(2**40), 2**62]))
_offsets = st.one_of(st.integers(0, 120), st.integers(-8, -1),
                     st.sampled_from([2**31, 2**62, -(2**62)]))


@st.composite
def view_step(draw, t: ggopt.Tensor):
    """One view-making call on ``t``: (description, zero-argument callable)."""
    kind = draw(st.sampled_from(["view", "view", "reshape", "permute", "transpose"]))
    ctx = t.ctx
    if kind == "view":
        nd = draw(st.integers(1, 4))
        ne = [draw(_sizes) for _ in range(nd)]
        nb = [draw(_strides) for _ in range(nd - 1)]
        off = draw(_offsets)
        fn = [ggopt.view_1d, ggopt.view_2d, ggopt.view_3d, ggopt.view_4d][nd - 1]
        return f"view_{nd}d{tuple(ne)} nb={nb} off={off}", lambda: fn(ctx, t, *ne, *nb, off)
    if kind == "reshape":
        n = t.nelements()
        first = draw(st.sampled_from([d for d in range(1, max(n, 1) + 1) if n % d == 0]
                                     or [1]))
        ne = (first, n // first) if first else (0,)
        if draw(st.booleans()):  # sometimes a wrong element count
            ne = (ne[0] + 1,) + ne[1:]
        return f"reshape{ne}", lambda: ggopt.reshape_2d(ctx, t, *ne) if len(ne) == 2 else \
            ggopt.reshape_1d(ctx, t, ne[0])
    if kind == "permute":
        axes = draw(st.permutations([0, 1, 2, 3]))
        return f"permute{tuple(axes)}", lambda: ggopt.permute(ctx, t, *axes)
    return "transpose", lambda: ggopt.transpose(ctx, t)


def _addressed(t: ggopt.Tensor) -> tuple[int, int]:
    """[first, last] byte offsets (relative to the owner's data) the view ``t`` can touch."""
    lo = hi = t.view_offs if t.view_src is not None else 0
    for n, s in zip(t.ne, t.nb):
        lo += min(0, (n - 1) * s)
        hi += max(0, (n - 1) * s)
    return lo, hi + t.type.size - 1


@hypothesis.settings(max_examples=4 * hypothesis.settings.default.max_examples)  # cheap ones
@given(ne=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_views_never_address_memory_outside_their_source(ne, data):
    ctx = ggopt.Context()
    guard_before = ctx.new_tensor_1d(F32, 16)
    a = ctx.new_tensor(F32, ne)
    guard_after = ctx.new_tensor_1d(F32, 16)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    a_lo, a_hi = byte_bounds(a.numpy())
    t = a
    for _ in range(data.draw(st.integers(1, 4))):
        what, make = data.draw(view_step(t))
        n_before = len(ctx)
        try:
            v = make()
        except GgoptError:
            assert len(ctx) == n_before, what  # refused before adding anything
            continue
        assert v.data_owner() is a, what
        if v.nelements():
            lo, hi = _addressed(v)
            assert 0 <= lo and hi < a.nbytes(), f"{what} addresses [{lo}, {hi}]"
            v_lo, v_hi = byte_bounds(v.numpy())
            assert a_lo <= v_lo and v_hi <= a_hi, what
        t = v
    assert guard_before.buffer is a.buffer is guard_after.buffer


# --- random small graphs ----------------------------------------------------------------------

_SHAPES = [(3, 2), (4, 3), (1, 3), (3, 1), (4, 1)]
_UNARY = ["relu", "tanh", "sigmoid", "gelu", "silu", "neg", "abs", "sqr", "soft_max",
          "sum_rows", "mean", "scale", "cont_t", "exp"]
_BINARY = ["add", "sub", "mul", "add_inplace", "mul_mat", "repeat", "acc"]


@st.composite
def programs(draw):
    """A list of instructions over a growing pool of tensors; inputs are pool[0..2]."""
    n_inputs = 3
    shapes = [draw(st.sampled_from(_SHAPES)) for _ in range(n_inputs)]
    prog = []
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.booleans()):
            prog.append(("u", draw(st.sampled_from(_UNARY)),
                         draw(st.integers(0, n_inputs + len(prog) - 1))))
        else:
            prog.append(("b", draw(st.sampled_from(_BINARY)),
                         draw(st.integers(0, n_inputs + len(prog) - 1)),
                         draw(st.integers(0, n_inputs + len(prog) - 1))))
    values = [draw(st.lists(st.floats(-3, 3, width=32), min_size=a * b, max_size=a * b))
              for a, b in shapes]
    return shapes, values, prog


def _apply(ctx, pool, ins):
    """The tensor of one instruction, or None when the shapes do not fit it."""
    if ins[0] == "u":
        _, op, i = ins
        x = pool[i]
        if op == "scale":
            return ggopt.scale(ctx, x, 0.75)
        if op == "cont_t":
            return ggopt.cont(ctx, ggopt.transpose(ctx, x))
        return getattr(ggopt, op)(ctx, x)
    _, op, i, j = ins
    a, b = pool[i], pool[j]
    try:
        if op == "mul_mat":
            return ggopt.mul_mat(ctx, a, b)
        if op == "repeat":
            return ggopt.repeat(ctx, b, a)
        if op == "acc":
            return ggopt.acc(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], 0)
        if op == "add_inplace":
            if a.op is ggopt.Op.NONE:  # never write into an input
                return None
            return ggopt.add_inplace(ctx, a, b)
        return getattr(ggopt, op)(ctx, a, b)
    except GgoptError:
        return None


def _run(shapes, values, prog, reuse: bool, n_threads: int) -> list[bytes]:
    ggopt.set_n_threads(n_threads)
    ctx_in = ggopt.Context()
    inputs = [ctx_in.new_tensor_2d(F32, *s) for s in shapes]
    gb.alloc_ctx_tensors(ctx_in, gb.cpu_init())
    for t, v in zip(inputs, values):
        t.numpy()[...] = np.asarray(v, np.float32).reshape(t.shape)
    ctx = ggopt.Context()
    pool = list(inputs)
    for ins in prog:
        out = _apply(ctx, pool, ins)
        pool.append(out if out is not None else pool[-1])
    results = pool[len(inputs):][-3:]
    g = ggopt.new_graph(ctx)
    for t in results:
        ggopt.set_output(t)
        ggopt.build_forward_expand(g, t)
    if not reuse:  # outputs are never freed or overwritten: no memory reuse at all
        for t in g.nodes:
            ggopt.set_output(t)
    gb.Scheduler([gb.cpu_init()]).graph_compute(g)
    return [gb.tensor_get(t).tobytes() for t in results]


@given(program=programs())
def test_random_graphs_same_bits_with_and_without_reuse_and_threads(program):
    shapes, values, prog = program
    try:
        want = _run(shapes, values, prog, True, 1)
        for reuse, n in ((False, 1), (True, 2), (False, 2)):
            assert _run(shapes, values, prog, reuse, n) == want, (reuse, n)
    finally:
        ggopt.set_n_threads(None)


# --- im2col: the sparse path equals the kernels --------------------------------------------------


@given(n=st.integers(1, 2), ic=st.integers(1, 2), ih=st.integers(1, 6), iw=st.integers(1, 6),
       kh=st.integers(1, 3), kw=st.integers(1, 3), s=st.tuples(*[st.integers(1, 3)] * 2),
       p=st.tuples(*[st.integers(0, 3)] * 2), d=st.tuples(*[st.integers(1, 2)] * 2),
       seed=st.integers(0, 2**16))
def test_im2col_sparse_path_equals_the_kernels(n, ic, ih, iw, kh, kw, s, p, d, seed):
    ow = (iw + 2 * p[0] - d[0] * (kw - 1) - 1) // s[0] + 1
    oh = (ih + 2 * p[1] - d[1] * (kh - 1) - 1) // s[1] + 1
    hypothesis.assume(ow > 0 and oh > 0)
    prm = (s[0], s[1], p[0], p[1], d[0], d[1])
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, ic, ih, iw)).astype(np.float32)
    want = np.empty((n, oh, ow, ic * kh * kw), np.float32)
    got = np.empty_like(want)
    _conv.im2col(x, want, kh, kw, *prm, 2)
    conv_sparse.im2col_gather(x, got, kh, kw, prm)
    assert np.array_equal(got, want)
    g = rng.standard_normal(want.shape).astype(np.float32)
    back_want, back_got = np.empty_like(x), np.empty_like(x)
    _conv.im2col_back(g, back_want, kh, kw, *prm, 2)
    conv_sparse.im2col_back_scatter(g, back_got, kh, kw, prm)
    np.testing.assert_allclose(back_got, back_want, rtol=1e-6, atol=1e-6)
