"""2-D calls of the 4-D ggml-order kernels, for the tests."""

from __future__ import annotations

from ggopt._kernels import _ggml_order as go


def softmax(x, mask, out, scale, n_threads, padded=False) -> None:
    """``_ggml_order.soft_max_rows`` on 2-D rows."""
    go.soft_max_rows(x[None, None], None if mask is None else mask[None, None], out[None, None],
                     scale, n_threads, padded)


def mm_f32(a, b, out, tiny, n_threads) -> None:
    """``_ggml_order.mul_mat_f32`` on 2-D operands."""
    go.mul_mat_f32(a[None, None], b[None, None], out[None, None], tiny, n_threads)
