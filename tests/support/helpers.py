"""Graph-building utilities for the core tests: run ops on NumPy data, check their gradients.

Arrays are given and returned in NumPy order; a tensor made from an array of shape
``(d3, d2, d1, d0)`` has ggml shape ``ne = [d0, d1, d2, d3]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import ggopt
from ggopt import backend as gb
from ggopt.types import from_np_dtype

Build = Callable[..., "ggopt.Tensor | Sequence[ggopt.Tensor]"]


def ne_of(shape: Sequence[int]) -> tuple[int, ...]:
    """The ggml ``ne`` of a NumPy shape (a 0-d shape gives ``(1,)``)."""
    return tuple(reversed(shape)) or (1,)


def new_tensor(ctx: ggopt.Context, arr: np.ndarray, name: str = "") -> ggopt.Tensor:
    """A tensor of ``ctx`` with the dtype and (reversed) shape of ``arr``; no data is set."""
    t = ctx.new_tensor(from_np_dtype(arr.dtype), ne_of(arr.shape))
    if name:
        ggopt.set_name(t, name)
    return t


def square_graph(n: int) -> tuple[ggopt.Context, ggopt.Context, ggopt.Tensor, ggopt.Tensor,
                                   ggopt.Graph]:
    """The smallest forward graph: ``y = sqr(a)`` for an F32 vector ``a`` of ``n`` elements,
    ``a`` in a weight context and ``y`` (an output) in a compute context; nothing allocated.
    Returns ``(ctx, cctx, a, y, gf)``."""
    ctx, cctx = ggopt.Context(), ggopt.Context()
    a = ctx.new_tensor_1d(ggopt.F32, n)
    y = ggopt.sqr(cctx, a)
    ggopt.set_output(y)
    gf = ggopt.new_graph(cctx)
    ggopt.build_forward_expand(gf, y)
    return ctx, cctx, a, y, gf


def product_graph(w: ggopt.Tensor, n_rows: int, n_threads: int = 2
                  ) -> tuple[ggopt.Tensor, ggopt.Tensor, ggopt.Graph, gb.Scheduler]:
    """``y = mul_mat(w, x)`` for an F32 input ``x`` of ``n_rows`` rows, in a compute context
    of its own, allocated on a scheduler of its own (``n_threads``). Returns
    ``(x, y, gf, sched)``."""
    cctx = ggopt.Context()
    x = cctx.new_tensor(ggopt.F32, (w.ne[0], n_rows))
    ggopt.set_input(x)
    y = ggopt.mul_mat(cctx, w, x)
    ggopt.set_output(y)
    gf = ggopt.new_graph_custom(cctx, 16, False)
    ggopt.build_forward_expand(gf, y)
    sched = gb.Scheduler([gb.cpu_init(n_threads)])
    sched.alloc_graph(gf)
    return x, y, gf, sched


def assert_close(got: np.ndarray, ref: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """``got`` equals ``ref`` element for element; trailing/leading size-1 dims may differ."""
    ref = np.asarray(ref)
    assert got.size == ref.size, f"got {got.shape}, expected {ref.shape}"
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=rtol, atol=atol)


def run(build: Build, *arrays: np.ndarray, n_threads: int | None = None) -> list[np.ndarray]:
    """Compute ``build(cctx, *tensors)`` on tensors holding ``arrays``; host copies of the results.

    ``build`` returns one tensor or a sequence of them; all are flagged OUTPUT. ``n_threads``
    pins the CPU backend's thread count (None: the process-wide setting).
    """
    ctx = ggopt.Context(no_alloc=True)
    ins = [new_tensor(ctx, a, f"in{i}") for i, a in enumerate(arrays)]
    for t in ins:
        ggopt.set_input(t)
    cctx = ggopt.Context(no_alloc=True)
    outs = build(cctx, *ins)
    outs = [outs] if isinstance(outs, ggopt.Tensor) else list(outs)
    gf = ggopt.new_graph_custom(cctx, 4096, False)
    for o in outs:
        ggopt.set_output(o)
        ggopt.build_forward_expand(gf, o)
    cpu = gb.cpu_init(n_threads)
    gb.alloc_ctx_tensors(ctx, cpu)
    for t, a in zip(ins, arrays):
        gb.tensor_set(t, a)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    return [gb.tensor_get(o) for o in outs]


def run1(build: Build, *arrays: np.ndarray) -> np.ndarray:
    """:func:`run` for a build that returns a single tensor."""
    (out,) = run(build, *arrays)
    return out


class GradProblem:
    """``loss = sum(build(cctx, *tensors) * w)`` with random ``w``, ready for gradient checks.

    The tensors of ``arrays`` at the indices ``params`` are parameters, the others inputs.
    With ``weighted=False`` the build must return the scalar loss itself. With ``accumulate``
    every parameter gets a persistent gradient accumulator (``grad_accs``), allocated with the
    parameters.
    """

    def __init__(self, build: Build, arrays: Sequence[np.ndarray], params: Sequence[int] = (0,),
                 seed: int = 0, weighted: bool = True, accumulate: bool = False) -> None:
        rng = np.random.default_rng(seed)
        self.arrays = [np.array(a) for a in arrays]
        self.params = list(params)
        self.ctx = ggopt.Context(no_alloc=True)
        self.tensors = [new_tensor(self.ctx, a, f"x{i}") for i, a in enumerate(self.arrays)]
        for i, t in enumerate(self.tensors):
            (ggopt.set_param if i in self.params else ggopt.set_input)(t)
        self.cctx = ggopt.Context(no_alloc=True)
        out = build(self.cctx, *self.tensors)
        if weighted:
            w = np.asarray(rng.uniform(0.5, 1.5, out.shape) * rng.choice([-1, 1], out.shape),
                           np.float32)
            wt = self.ctx.new_tensor(ggopt.F32, out.ne)
            ggopt.set_input(wt)
            self.arrays.append(w)
            self.tensors.append(wt)
            out = ggopt.sum(self.cctx, ggopt.mul(self.cctx, out, wt))
        self.loss = out
        ggopt.set_loss(self.loss)
        ggopt.set_output(self.loss)
        self.gf = ggopt.new_graph_custom(self.cctx, 4096, True)
        ggopt.build_forward_expand(self.gf, self.loss)
        self.gb = ggopt.graph_dup(self.cctx, self.gf)
        self.accs = None
        if accumulate:
            self.accs = [self.ctx.new_tensor(ggopt.F32, n.ne) if n.is_param else None
                         for n in self.gf.nodes]
        ggopt.build_backward_expand(self.cctx, self.gb, self.accs)
        self.grads = [ggopt.graph_get_grad(self.gb, self.tensors[i]) for i in self.params]
        for i, g in zip(self.params, self.grads):
            assert g is not None, f"parameter {i} got no gradient"
            ggopt.set_output(g)
        self.cpu = gb.cpu_init()
        gb.alloc_ctx_tensors(self.ctx, self.cpu)
        for t, a in zip(self.tensors, self.arrays):
            gb.tensor_set(t, a)
        self.sched = gb.Scheduler([self.cpu])
        self.sched.alloc_graph(self.gb)

    def evaluate(self) -> float:
        """Reset the loss gradient to 1, compute forward and backward, return the loss."""
        ggopt.graph_reset(self.gb)
        self.sched.graph_compute(self.gb)
        return self.loss.numpy().item()

    def analytic(self) -> list[np.ndarray]:
        """The gradients of the loss w.r.t. the parameters, NumPy order."""
        self.evaluate()
        return [gb.tensor_get(g).reshape(self.arrays[i].shape)
                for i, g in zip(self.params, self.grads)]

    def numeric(self, eps: float) -> list[np.ndarray]:
        """Central differences of the loss w.r.t. every parameter element."""
        out = []
        for i in self.params:
            t, a = self.tensors[i], self.arrays[i]
            num = np.zeros(a.shape, np.float64)
            work = a.copy()
            for idx in np.ndindex(a.shape):
                work[idx] = a[idx] + eps
                step = float(work[idx])
                gb.tensor_set(t, work)
                fp = self.evaluate()
                work[idx] = a[idx] - eps
                step -= float(work[idx])  # the float32 step actually taken
                gb.tensor_set(t, work)
                fm = self.evaluate()
                work[idx] = a[idx]
                num[idx] = (fp - fm) / step
            gb.tensor_set(t, a)
            out.append(num)
        return out


def check_grads(build: Build, *arrays: np.ndarray, params: Sequence[int] = (0,),
                eps: float = 1e-2, rtol: float = 2e-2, atol: float = 2e-3,
                weighted: bool = True) -> None:
    """Analytic gradients of ``sum(build(...) * w)`` match central differences."""
    prob = GradProblem(build, arrays, params, weighted=weighted)
    ana = prob.analytic()
    num = prob.numeric(eps)
    for i, a, n in zip(params, ana, num):
        np.testing.assert_allclose(a, n, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of parameter {i}")


def layout(arr: np.ndarray, kind: str) -> np.ndarray:
    """The values of ``arr`` in a view with the memory layout ``kind`` (any number of dims).

    ``contiguous``, ``readonly``, ``strided`` (every dim stepped, inner stride 3 elements),
    ``permuted`` (a transposed buffer: no dim contiguous), ``padded_rows`` (contiguous rows,
    padded row stride) or ``reversed`` (negative strides on every other dim and the last).
    """
    if kind == "contiguous":
        return arr.copy()
    if kind == "readonly":
        view = arr.copy()
        view.setflags(write=False)
        return view
    if kind == "strided":
        big = np.zeros([2 * n for n in arr.shape[:-1]] + [3 * arr.shape[-1]], arr.dtype)
        view = big[(slice(None, None, 2),) * (arr.ndim - 1) + (slice(None, None, 3),)]
    elif kind == "permuted":
        view = np.zeros(arr.shape[::-1], arr.dtype).T
    elif kind == "padded_rows":
        view = np.zeros(arr.shape[:-1] + (arr.shape[-1] + 3,), arr.dtype)[..., 1:-2]
    elif kind == "reversed":
        flips = tuple(slice(None, None, -1) if i % 2 == 0 or i == arr.ndim - 1 else slice(None)
                      for i in range(arr.ndim))
        view = np.zeros(arr.shape, arr.dtype)[flips]
    else:
        raise ValueError(f"unknown layout {kind!r}")
    view[...] = arr
    return view


def adamw_params(alpha, b1, b2, eps, wd, t):
    """The float32 parameter row of the AdamW kernel: alpha, beta1, beta2, eps, wd and the bias
    corrections of step ``t``."""
    return np.array([alpha, b1, b2, eps, wd, 1 / (1 - b1**t), 1 / (1 - b2**t)], dtype=np.float32)
