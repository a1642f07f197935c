"""The CuPy backend: graphs computed on an NVIDIA GPU (the role of ggml's CUDA backend).

Install the optional dependency with ``pip install -e ".[gpu]"`` (the ``cupy-cuda12x`` wheel,
for CUDA 12 drivers). Only :func:`ggopt.backend.cupy_init` imports this module, and CuPy itself
is imported when a :class:`CuPyBackend` is created, so ``import ggopt`` never needs CuPy.

Every op is the :mod:`.xp_ops` array code over CuPy arrays, except the ones every training step
runs, which are fused CUDA kernels: the AdamW and SGD updates (one pass over the parameter,
its gradient and the moments, reading the step parameters on the device), the element-wise
unary functions and their derivatives, and cross-entropy forward and backward (row max, a
float64 row reduction of the exponentials, then one fused pass). The scheduler never hands a
backend two nodes at once, so an add followed by a relu stays two kernels: fusing them would
need the add's result in memory anyway, for the relu's backward pass.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ..errors import BackendUnavailableError, DTypeError, ShapeError
from ..tensor import Op, Tensor, UnaryOp
from .base import Step
from .buffer import Buffer
from .xp import ArrayBackend
from .xp_ops import ce_rows, check_unary_back

__all__ = ["CuPyBackend"]

_FN = "ggml_backend_cuda_init"


def _import_cupy() -> tuple[ModuleType, ModuleType]:
    try:
        import cupy
        import cupyx
    except (ImportError, OSError, RuntimeError) as exc:
        raise BackendUnavailableError(
            f'{_FN}: CuPy is not available ({type(exc).__name__}: {exc}); install it with '
            'pip install -e ".[gpu]" (cupy-cuda12x)'
        ) from exc
    return cupy, cupyx


def _open_device(cupy: ModuleType, device: int):
    """The ``cupy.cuda.Device``, after a small kernel ran on it (driver, runtime and NVRTC)."""
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except (RuntimeError, OSError) as exc:
        raise BackendUnavailableError(
            f"{_FN}: no usable CUDA device ({type(exc).__name__}: {exc})") from exc
    if device >= count:
        raise BackendUnavailableError(
            f"{_FN}: CUDA device {device} requested, {count} device(s) present")
    dev = cupy.cuda.Device(device)
    try:
        with dev:
            float((cupy.arange(4, dtype=cupy.float32) * 2).sum())
    except Exception as exc:  # any failure here means the device cannot run ggopt's kernels
        raise BackendUnavailableError(
            f"{_FN}: CUDA device {device} cannot run kernels ({type(exc).__name__}: {exc})"
        ) from exc
    return dev


class CuPyBackend(ArrayBackend):
    """Computes on CUDA device ``device`` with CuPy (ggml_backend_cuda).

    Raises
    ------
    BackendUnavailableError
        CuPy is not installed, or no usable CUDA device ``device`` exists; the message says why.
    """

    def __init__(self, device: int = 0) -> None:
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            raise DTypeError(f"{_FN}: device must be an int, got {device!r}")
        if device < 0:
            raise ShapeError(f"{_FN}: device must be >= 0, got {device}")
        cupy, cupyx = _import_cupy()
        dev = _open_device(cupy, int(device))
        super().__init__(cupy, f"CUDA{int(device)}")
        self.device = int(device)
        self._dev = dev
        self._scatter_add = cupyx.scatter_add
        self._compilers.update(_fused_compilers(cupy))

    # --- array-module hooks -------------------------------------------------------------------
    def _alloc(self, nbytes: int):
        with self._dev:
            return self.xp.empty(nbytes, dtype=self.xp.uint8)

    def _bytes_view(self, data, offset: int, shape: tuple[int, ...], strides: tuple[int, ...],
                    dtype: np.dtype):
        return self.xp.ndarray(shape, dtype, memptr=data.data + offset, strides=strides)

    def to_host(self, arr) -> np.ndarray:
        with self._dev:
            return arr.get()

    def from_host(self, dst, host: np.ndarray) -> None:
        with self._dev:
            if dst.flags.c_contiguous and host.dtype == dst.dtype:
                dst.set(np.ascontiguousarray(host).reshape(dst.shape))
            else:
                dst[...] = self.xp.asarray(host).reshape(dst.shape)

    def scatter_add(self, dst, idx, src) -> None:
        self._scatter_add(dst, idx, src)

    def _wrap(self, step: Step) -> Step:
        dev = self._dev

        def on_device() -> None:
            with dev:
                step()

        return on_device

    # --- backend interface ----------------------------------------------------------------
    def fill(self, t: Tensor, value: float) -> None:
        with self._dev:
            super().fill(t, value)

    def array_view(self, buf: Buffer, t: Tensor):
        with self._dev:
            return super().array_view(buf, t)

    def compile_node(self, node: Tensor, srcs: tuple[Tensor, ...]) -> Step | None:
        with self._dev:  # compilers allocate scratch arrays
            return super().compile_node(node, srcs)

    def copy_step(self, src: Tensor, dst: Tensor) -> Step:
        with self._dev:
            return super().copy_step(src, dst)

    def synchronize(self) -> None:
        self._dev.synchronize()


# --- fused kernels ------------------------------------------------------------------------

_PREAMBLE = r"""
__device__ __forceinline__ float ggopt_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* the argument of tanh in ggml's GELU: sqrt(2/pi) * x * (1 + 0.044715 x^2) */
__device__ __forceinline__ float ggopt_gelu_u(float x) {
    return 0.7978845608f * x * (1.0f + 0.044715f * x * x);
}
"""

#: y = f(x); GELU as x*sigmoid(2u) == 0.5x(1 + tanh u), without cancellation for x << 0
_UNARY_SRC = {
    UnaryOp.NEG: "y = -x",
    UnaryOp.EXP: "y = expf(x)",
    UnaryOp.ABS: "y = fabsf(x)",
    UnaryOp.TANH: "y = tanhf(x)",
    UnaryOp.RELU: "y = x > 0.0f ? x : 0.0f",
    UnaryOp.STEP: "y = x > 0.0f ? 1.0f : 0.0f",
    UnaryOp.SIGMOID: "y = ggopt_sigmoid(x)",
    UnaryOp.SILU: "y = x * ggopt_sigmoid(x)",
    UnaryOp.GELU: "y = x * ggopt_sigmoid(2.0f * ggopt_gelu_u(x))",
}

#: y = g * f'(x)
_UNARY_BACK_SRC = {
    UnaryOp.NEG: "y = -g",
    UnaryOp.EXP: "y = g * expf(x)",
    UnaryOp.ABS: "y = g * (x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f))",
    UnaryOp.TANH: "const float t = tanhf(x); y = g * (1.0f - t * t)",
    UnaryOp.RELU: "y = x > 0.0f ? g : 0.0f",
    UnaryOp.SIGMOID: "const float t = ggopt_sigmoid(x); y = g * (t * (1.0f - t))",
    UnaryOp.SILU: "const float t = ggopt_sigmoid(x); y = g * (t * (1.0f + x * (1.0f - t)))",
    UnaryOp.GELU: (
        "const float s = ggopt_sigmoid(2.0f * ggopt_gelu_u(x));"
        " const float du = 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);"
        " y = g * (s + 2.0f * x * s * (1.0f - s) * du)"
    ),
}

# spec §2.10; p = [alpha, beta1, beta2, eps, wd, 1/(1-beta1^t), 1/(1-beta2^t)]
_ADAMW_SRC = """
const float alpha = p[0], b1 = p[1], b2 = p[2], eps = p[3], wd = p[4];
m = m * b1 + g * (1.0f - b1);
v = v * b2 + g * g * (1.0f - b2);
const float mh = m * p[5];
const float vh = sqrtf(v * p[6]) + eps;
w = w * (1.0f - alpha * wd) - alpha * mh / vh
"""

_SGD_SRC = "w = w * (1.0f - p[0] * p[1]) - p[0] * g"  # p = [alpha, wd]

_CE_BACK_SRC = "d = (expf(x - mx) * (float)(1.0 / s) - y) * c"


class _Kernels:
    """The fused kernels, built once per process (CuPy compiles them on first use)."""

    def __init__(self, cupy: ModuleType) -> None:
        ek, rk = cupy.ElementwiseKernel, cupy.ReductionKernel
        self.unary = {u: ek("float32 x", "float32 y", src, f"ggopt_{u.value}",
                            preamble=_PREAMBLE) for u, src in _UNARY_SRC.items()}
        self.unary_back = {u: ek("float32 x, float32 g", "float32 y", src,
                                 f"ggopt_{u.value}_back", preamble=_PREAMBLE)
                           for u, src in _UNARY_BACK_SRC.items()}
        self.adamw = ek("float32 g, raw float32 p", "float32 w, float32 m, float32 v",
                        _ADAMW_SRC, "ggopt_adamw")
        self.sgd = ek("float32 g, raw float32 p", "float32 w", _SGD_SRC, "ggopt_sgd")
        # sum of exp(x - max) per row, in double (exps in float, as ggml)
        self.sumexp = rk("float32 x, float32 mx", "float64 s", "expf(x - mx)", "a + b",
                         "s = a", "0", "ggopt_sumexp")
        # sum over everything of y * log_softmax(x), in double
        self.ce_dot = rk("float32 x, float32 y, float32 mx, float64 lse", "float64 r",
                         "(double)y * ((double)(x - mx) - lse)", "a + b", "r = a", "0",
                         "ggopt_ce_dot")
        self.ce_back = ek("float32 x, float32 y, float32 mx, float64 s, float32 c",
                          "float32 d", _CE_BACK_SRC, "ggopt_ce_back")


_KERNELS: _Kernels | None = None


def _fused_compilers(cupy: ModuleType) -> dict:
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _Kernels(cupy)
    k = _KERNELS

    def unary(be: CuPyBackend, node: Tensor, srcs: tuple) -> Step:
        fn = k.unary[node.op_params]
        a, d = srcs[0].array4d(), node.array4d()
        return lambda: fn(a, d)

    def unary_back(be: CuPyBackend, node: Tensor, srcs: tuple) -> Step:
        check_unary_back(node)
        fn = k.unary_back[node.op_params]
        x, g, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
        return lambda: fn(x, g, d)

    def adamw(be: CuPyBackend, node: Tensor, srcs: tuple) -> Step:
        w, g, m, v, p = (s.array4d() for s in srcs)
        return lambda: k.adamw(g, p.reshape(-1), w, m, v)

    def sgd(be: CuPyBackend, node: Tensor, srcs: tuple) -> Step:
        w, g, p = (s.array4d() for s in srcs)
        return lambda: k.sgd(g, p.reshape(-1), w)

    def ce(be: CuPyBackend, node: Tensor, srcs: tuple) -> Step:
        a4, b4, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
        shape = ce_rows(srcs[0])

        def step() -> None:
            x, y = a4.reshape(shape), b4.reshape(shape)
            mx = x.max(axis=1, keepdims=True)
            lse = cupy.log(k.sumexp(x, mx, axis=1, keepdims=True))
            d[...] = -k.ce_dot(x, y, mx, lse) / shape[0]

        return step

    def ce_back(be: CuPyBackend, node: Tensor, srcs: tuple) -> Step:
        g4, a4, b4 = (s.array4d() for s in srcs)
        shape = ce_rows(srcs[1])
        d = node.array4d().reshape(shape)
        nrows = np.float32(shape[0])

        def step() -> None:
            x, y = a4.reshape(shape), b4.reshape(shape)
            mx = x.max(axis=1, keepdims=True)
            s = k.sumexp(x, mx, axis=1, keepdims=True)
            k.ce_back(x, y, mx, s, g4[0, 0, 0, 0] / nrows, d)

        return step

    return {
        Op.UNARY: unary, Op.UNARY_BACK: unary_back, Op.OPT_STEP_ADAMW: adamw,
        Op.OPT_STEP_SGD: sgd, Op.CROSS_ENTROPY_LOSS: ce, Op.CROSS_ENTROPY_LOSS_BACK: ce_back,
    }
