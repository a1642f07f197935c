"""Kernel benchmarks at MNIST shapes: each ggopt kernel beside its NumPy / PyTorch reference.

Every group runs its references first and ggopt last; the ggopt rows store their speed-up over
each reference (``ratio_vs_<ref>``, above 1 is faster) and the issue's target in
``extra_info``. Targets compare equal thread counts: NumPy's ufuncs and ``np.copyto`` run on
one thread, so they face the ``ggopt_1t`` row (the same kernel on one thread); PyTorch and
BLAS run on ``GGOPT_BENCH_THREADS`` threads, as the ``ggopt`` row does. Every row warms up and
runs at least ``MIN_ROUNDS`` rounds; set-up is outside the timer on every side. Run with
``pytest bench`` (see bench/README.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt._kernels import _elementwise as ew
from ggopt._kernels import _optim, _softmax

pytestmark = pytest.mark.usefixtures("bench_threads")

MIN_ROUNDS = 5
FAST = {"warmup": True, "warmup_iterations": 1000, "min_rounds": MIN_ROUNDS}  # microseconds
SLOW = {"warmup": True, "warmup_iterations": 3, "min_rounds": MIN_ROUNDS}  # tens of ms


def _torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(ggopt.get_n_threads())
    return torch


def _kernel_threads(impl: str) -> int:
    """The thread count of a ggopt row: 1 for ``ggopt_1t``, else the benchmark's setting."""
    return 1 if impl == "ggopt_1t" else ggopt.get_n_threads()


def _normal(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _graph(build: Callable, arrays: list[np.ndarray], params: tuple[int, ...] = ()):
    """Compute ``build(cctx, *leafs)`` on leaf tensors holding ``arrays`` (NumPy order).

    The leafs at the indices ``params`` are parameters; with any, ``build`` returns a scalar
    loss and the graph also computes its gradients (the other leafs are inputs and get none).
    Returns ``(step, outputs)``: ``step()`` runs one compute; ``outputs`` holds the result
    tensor, then the parameters' gradients.
    """
    cpu = gb.cpu_init()
    ctx = ggopt.Context()
    leafs = [ctx.new_tensor(ggopt.F32, a.shape[::-1]) for a in arrays]
    for i, t in enumerate(leafs):
        (ggopt.set_param if i in params else ggopt.set_input)(t)
    gb.alloc_ctx_tensors(ctx, cpu)
    for t, a in zip(leafs, arrays):
        gb.tensor_set(t, a)
    cctx = ggopt.Context()
    out = build(cctx, *leafs)
    ggopt.set_output(out)
    g = ggopt.new_graph_custom(cctx, 256, bool(params))
    ggopt.build_forward_expand(g, out)
    outputs = [out]
    if params:
        ggopt.set_loss(out)
        g = ggopt.graph_dup(cctx, g)
        ggopt.build_backward_expand(cctx, g)
        outputs += [ggopt.graph_get_grad(g, leafs[i]) for i in params]
        for t in outputs[1:]:
            ggopt.set_output(t)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(g)
    if not params:
        return lambda: sched.graph_compute(g), outputs

    def step() -> None:
        ggopt.graph_reset(g)  # the loss gradient back to 1
        sched.graph_compute(g)

    return step, outputs


# --- mul_mat / out_prod at the fc1 shapes of the MNIST MLP ---------------------------------

K_IN, N_HIDDEN, BATCH = 784, 500, 500
MATMUL_FLOP = 2 * K_IN * N_HIDDEN * BATCH


def _matmul_case(case: str):
    """(ggopt build, leaf arrays, NumPy reference writing into its argument, result shape)."""
    w = _normal(N_HIDDEN, K_IN, seed=1)  # W1, ggml [784, 500]
    x = _normal(BATCH, K_IN, seed=2)  # X, ggml [784, 500]
    g = _normal(BATCH, N_HIDDEN, seed=3)  # G = dL/d(mul_mat(W1, X)), ggml [500, 500]
    if case == "fc1_forward":  # X W1^T: ggml mul_mat(W1, X)
        return (lambda c, tw, tx: ggopt.mul_mat(c, tw, tx), [w, x],
                lambda out: np.matmul(x, w.T, out=out), (BATCH, N_HIDDEN))
    if case == "dW1":  # G^T X: ggml out_prod(X, G)
        return (lambda c, tx, tg: ggopt.out_prod(c, tx, tg), [x, g],
                lambda out: np.matmul(g.T, x, out=out), (N_HIDDEN, K_IN))
    # G W1: ggml out_prod(W1, transpose(G)), as in mul_mat's backward rule
    return (lambda c, tw, tg: ggopt.out_prod(c, tw, ggopt.transpose(c, tg)), [w, g],
            lambda out: np.matmul(g, w, out=out), (BATCH, K_IN))


@pytest.mark.benchmark(**FAST)
@pytest.mark.parametrize("impl", ["numpy", "ggopt"])
@pytest.mark.parametrize("case", ["fc1_forward", "dW1", "dX"])
def test_mul_mat(benchmark, ratio_to, case, impl):
    """One-node ggopt graph (scheduler compute) vs NumPy's matmul of the same operands."""
    benchmark.group = f"mul_mat {case} [784x500x500]"
    build, arrays, ref, shape = _matmul_case(case)
    expected = np.empty(shape, np.float32)
    ref(expected)
    if impl == "numpy":
        got = np.empty(shape, np.float32)
        benchmark(ref, got)
    else:
        step, (node,) = _graph(build, arrays)
        benchmark(step)
        got = node.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
    if benchmark.stats is not None:
        gflops = MATMUL_FLOP / benchmark.stats.stats.median / 1e9
        benchmark.extra_info["gflops"] = round(gflops, 2)
    ratio_to(impl, numpy=0.9 if impl == "ggopt" else None)


# --- softmax + cross-entropy, forward and backward, logits [10, 500] ------------------------

N_CLASSES = 10


def _ce_numpy(x: np.ndarray, y: np.ndarray):
    """NumPy reference: max-subtract, exp, sum, log, loss and (softmax - y)/nrows, in place."""
    rows = x.shape[0]
    mx = np.empty((rows, 1), np.float32)
    s = np.empty((rows, 1), np.float32)
    sh = np.empty_like(x)
    e = np.empty_like(x)
    dx = np.empty_like(x)

    def step() -> float:
        np.max(x, axis=1, keepdims=True, out=mx)
        np.subtract(x, mx, out=sh)
        np.exp(sh, out=e)
        np.sum(e, axis=1, keepdims=True, out=s)
        np.divide(e, s, out=dx)  # softmax, before s becomes log(s)
        np.log(s, out=s)
        np.subtract(sh, s, out=sh)  # log-softmax
        loss = -float(np.vdot(y, sh)) / rows
        np.subtract(dx, y, out=dx)
        np.multiply(dx, 1.0 / rows, out=dx)
        return loss

    return step, dx


def _ce_torch(x: np.ndarray, y: np.ndarray):
    torch = _torch()
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.tensor(y)

    def step() -> float:
        tx.grad = None
        loss = torch.nn.functional.cross_entropy(tx, ty)  # probabilities as targets
        loss.backward()
        return loss.item()

    return step, None


def _ce_ggopt(x: np.ndarray, y: np.ndarray, n: int):
    dx = np.empty_like(x)

    def step() -> float:
        loss = _softmax.cross_entropy_loss(x, y, n)
        _softmax.cross_entropy_loss_back(1.0, x, y, dx, n)
        return loss

    return step, dx


@pytest.mark.benchmark(group="cross_entropy fwd+bwd [10x500]", **FAST)
@pytest.mark.parametrize("impl", ["numpy", "torch", "ggopt_1t", "ggopt"])
def test_cross_entropy(benchmark, ratio_to, impl):
    """``cross_entropy_loss`` + ``cross_entropy_loss_back`` kernels vs NumPy (one thread, as
    ``ggopt_1t``) and torch (the benchmark's threads, as ``ggopt``)."""
    x = 3 * _normal(BATCH, N_CLASSES, seed=4)
    y = np.eye(N_CLASSES, dtype=np.float32)[np.random.default_rng(5).integers(0, 10, BATCH)]
    if impl.startswith("ggopt"):
        step, dx = _ce_ggopt(x, y, _kernel_threads(impl))
    else:
        step, dx = {"numpy": _ce_numpy, "torch": _ce_torch}[impl](x, y)
    ref_step, ref_dx = _ce_numpy(x, y)
    expected = ref_step()
    loss = benchmark(step)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    if dx is not None:
        np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-7)
    ratio_to(impl, numpy=2.0 if impl == "ggopt_1t" else None, torch=None, ggopt_1t=None)


# --- AdamW over the 397,510 parameters of the MNIST MLP -----------------------------------

PARAM_SHAPES = [(N_HIDDEN, K_IN), (N_HIDDEN,), (N_CLASSES, N_HIDDEN), (N_CLASSES,)]
ALPHA, BETA1, BETA2, EPS, WD, T = 1e-3, 0.9, 0.999, 1e-8, 0.01, 10


def _adamw_state():
    """[(weights, grads, m, v)] per parameter tensor, float32, NumPy order."""
    state = []
    for i, shape in enumerate(PARAM_SHAPES):
        w, g, m, v = (_normal(*shape, seed=10 * i + k) for k in range(4))
        state.append((w, g, 0.1 * m, 0.01 * v * v))
    return state


def _adamw_numpy(state):
    b1h, b2h = 1 / (1 - BETA1**T), 1 / (1 - BETA2**T)
    keep, step_size = 1 - ALPHA * WD, ALPHA * b1h
    work = [(w, g, m, v, np.empty_like(w), np.empty_like(w)) for w, g, m, v in state]

    def step() -> None:
        # ggml_opt_step_adamw with in-place ufuncs: 14 passes over memory per tensor
        for w, g, m, v, t1, t2 in work:
            m *= BETA1
            np.multiply(g, 1 - BETA1, out=t1)
            m += t1
            v *= BETA2
            np.multiply(g, g, out=t1)
            t1 *= 1 - BETA2
            v += t1
            np.multiply(v, b2h, out=t1)
            np.sqrt(t1, out=t1)
            t1 += EPS
            np.multiply(m, step_size, out=t2)
            t2 /= t1
            w *= keep
            w -= t2

    return step


def _adamw_torch(state, fused: bool):
    torch = _torch()
    params = []
    for w, g, _, _ in state:
        p = torch.nn.Parameter(torch.from_numpy(w))
        p.grad = torch.from_numpy(g)
        params.append(p)
    kw = {"fused": True} if fused else {"foreach": True}
    try:
        opt = torch.optim.AdamW(params, lr=ALPHA, betas=(BETA1, BETA2), eps=EPS,
                                weight_decay=WD, **kw)
        opt.step()
    except (RuntimeError, ValueError) as exc:
        pytest.skip(f"torch.optim.AdamW({kw}) is not supported here: {exc}")
    return opt.step


def _adamw_ggopt(state, n: int):
    b1h, b2h = 1 / (1 - BETA1**T), 1 / (1 - BETA2**T)
    params = np.array([ALPHA, BETA1, BETA2, EPS, WD, b1h, b2h], np.float32)
    flat = [tuple(a.reshape(-1) for a in s) for s in state]

    def step() -> None:
        for w, g, m, v in flat:  # one opt_step_adamw node per parameter, as ggml-opt builds
            _optim.adamw_step(w, g, m, v, params, n)

    return step


@pytest.mark.benchmark(group="adamw 397510 params", **FAST)
@pytest.mark.parametrize("impl", ["numpy", "torch_foreach", "torch_fused", "ggopt_1t", "ggopt"])
def test_adamw(benchmark, ratio_to, impl):
    """``_optim.adamw_step`` vs NumPy in-place ufuncs (one thread, as ``ggopt_1t``) and
    torch.optim.AdamW (the benchmark's threads, as ``ggopt``), same tensors."""
    state = _adamw_state()
    n = _kernel_threads(impl)
    make = {
        "numpy": _adamw_numpy,
        "torch_foreach": lambda s: _adamw_torch(s, fused=False),
        "torch_fused": lambda s: _adamw_torch(s, fused=True),
        "ggopt_1t": lambda s: _adamw_ggopt(s, n),
        "ggopt": lambda s: _adamw_ggopt(s, n),
    }[impl]
    if impl.startswith("ggopt"):  # one step from the same state agrees with the NumPy expression
        check, ref = _adamw_state(), _adamw_state()
        _adamw_ggopt(check, n)()
        _adamw_numpy(ref)()
        for got, want in zip(check, ref):
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    benchmark(make(state))  # repeated steps keep every value finite and normal
    assert all(np.isfinite(w).all() for w, _, _, _ in state)
    ratio_to(impl, numpy=3.0 if impl == "ggopt_1t" else None,
             torch_foreach=1.0 if impl == "ggopt" else None,
             torch_fused=1.0 if impl == "ggopt" else None, ggopt_1t=None)


# --- element-wise kernels over [500, 500] vs one streaming copy -----------------------------

EW_SHAPE = (1, 1, BATCH, N_HIDDEN)  # a hidden layer at batch 500, ggml [500, 500]
EW_TARGET = 0.9  # the target: one thread, at least 0.9 of np.copyto's speed


def _ew_case(op: str, impl: str):
    """A zero-argument step writing into ``d`` and the expected result."""
    x, g = _normal(*EW_SHAPE, seed=20), _normal(*EW_SHAPE, seed=21)
    b = _normal(1, 1, 1, N_HIDDEN, seed=22)  # a bias row, tiled over the batch
    d = np.empty(EW_SHAPE, np.float32)
    n = _kernel_threads(impl)
    s = np.float32(0.5)
    mask = np.empty(EW_SHAPE, bool)
    ref = {
        "add_bias": x + b, "relu": np.maximum(x, 0), "relu_back": g * (x > 0), "scale": x * s,
    }[op]
    if impl == "copyto":
        return (lambda: np.copyto(d, x)), d, x
    if impl == "ggopt_1t_inplace":  # relu_back over its incoming gradient, as the MLP's graph
        # places it (the allocator's in-place reuse): g * step(x) is idempotent
        return (lambda: ew.unary_back(ew.UN_RELU, x, g, g, 1)), g, ref
    if impl == "numpy":
        step = {
            "add_bias": lambda: np.add(x, b, out=d),
            "relu": lambda: np.maximum(x, 0, out=d),
            "relu_back": lambda: np.multiply(g, np.greater(x, 0, out=mask), out=d),
            "scale": lambda: np.multiply(x, s, out=d),
        }[op]
    else:
        step = {
            "add_bias": lambda: ew.binary(ew.BIN_ADD, x, b, d, n),
            "relu": lambda: ew.unary(ew.UN_RELU, x, d, n),
            "relu_back": lambda: ew.unary_back(ew.UN_RELU, x, g, d, n),
            "scale": lambda: ew.scale(x, d, s, 0.0, n),
        }[op]
    return step, d, ref


@pytest.mark.benchmark(**FAST)
@pytest.mark.parametrize("impl", ["copyto", "numpy", "ggopt_1t", "ggopt", "ggopt_1t_inplace"])
@pytest.mark.parametrize("op", ["add_bias", "relu", "relu_back", "scale"])
def test_elementwise(benchmark, ratio_to, op, impl):
    """ggopt element-wise kernels vs ``np.copyto`` of the output's bytes (and NumPy ufuncs);
    both references run on one thread, so the target applies to ``ggopt_1t``. relu backward
    also runs in place over its gradient (``ggopt_1t_inplace``), where the MLP's graph runs it:
    out of place its three arrays (3 MB) overflow this machine's 2 MB L2, a copy's two do not."""
    if impl == "ggopt_1t_inplace" and op != "relu_back":
        pytest.skip("only relu backward runs in place in the MLP's graph")
    benchmark.group = f"elementwise {op} [500x500]"
    step, d, expected = _ew_case(op, impl)
    benchmark(step)
    np.testing.assert_array_equal(d, expected)
    if benchmark.stats is not None:
        median = benchmark.stats.stats.median
        # bytes of the copy (read and write the output's size), and of every array the op
        # streams: relu_back reads two full arrays, so it moves 1.5x a copy's bytes
        streams = 3 if op == "relu_back" and impl != "copyto" else 2
        benchmark.extra_info["copy_GBps"] = round(2 * d.nbytes / median / 1e9, 2)
        benchmark.extra_info["streamed_GBps"] = round(streams * d.nbytes / median / 1e9, 2)
    ratio_to(impl, copyto=EW_TARGET if impl.startswith("ggopt_1t") else None, numpy=None,
             ggopt_1t=None)


# --- conv_2d + pool_2d at the MNIST-CNN shapes, batch 500 ---------------------------------

C1, C2, SIDE = 8, 16, 28


def _conv_arrays():
    x = np.random.default_rng(30).uniform(0, 1, (BATCH, 1, SIDE, SIDE)).astype(np.float32)
    return x, 0.3 * _normal(C1, 1, 3, 3, seed=31), 0.1 * _normal(C2, C1, 3, 3, seed=32)


def _conv_build(c, tk1, tk2, tx):
    h = ggopt.conv_2d(c, tk1, tx, 1, 1, 1, 1, 1, 1)  # [28, 28, 8, 500]
    h = ggopt.pool_2d(c, h, ggopt.OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
    h = ggopt.conv_2d(c, tk2, h, 1, 1, 1, 1, 1, 1)  # [14, 14, 16, 500]
    h = ggopt.pool_2d(c, h, ggopt.OP_POOL_MAX, 2, 2, 2, 2, 0, 0)  # [7, 7, 16, 500]
    return ggopt.sum(c, h)


def _conv_ggopt(backward: bool):
    x, k1, k2 = _conv_arrays()
    # The images are an input: like the MNIST CNN, no gradient is computed for them.
    step, outputs = _graph(_conv_build, [k1, k2, x], params=(0, 1) if backward else ())
    return step, lambda: [t.numpy().copy() for t in outputs]


def _conv_torch(backward: bool):
    torch = _torch()
    f = torch.nn.functional
    x, k1, k2 = (torch.tensor(a) for a in _conv_arrays())
    k1.requires_grad_(backward)
    k2.requires_grad_(backward)
    out = []

    def forward():
        h = f.max_pool2d(f.conv2d(x, k1, padding=1), 2)
        return f.max_pool2d(f.conv2d(h, k2, padding=1), 2).sum()

    def step() -> None:
        out.clear()
        if backward:
            k1.grad = k2.grad = None
            out.append(forward())
            out[0].backward()
        else:
            with torch.no_grad():
                out.append(forward())

    def results() -> list[np.ndarray]:
        grads = [k1.grad.numpy(), k2.grad.numpy()] if backward else []
        return [out[0].detach().numpy()] + grads

    return step, results


@pytest.mark.benchmark(**SLOW)
@pytest.mark.parametrize("impl", ["torch", "ggopt"])
@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
def test_conv_pool(benchmark, ratio_to, pass_, impl):
    """conv 1->8, pool, conv 8->16, pool (3x3, pad 1) on 500 images of 28x28, then sum."""
    benchmark.group = f"conv+pool {pass_} [MNIST-CNN, batch 500]"
    backward = pass_ == "fwd+bwd"
    step, results = {"torch": _conv_torch, "ggopt": _conv_ggopt}[impl](backward)
    benchmark(step)
    ref_step, ref_results = _conv_torch(backward)
    ref_step()
    for got, want in zip(results(), ref_results(), strict=True):
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-2)
    ratio_to(impl, torch=1.0 if impl == "ggopt" else None)
