"""Op constructors with ggml's names and argument order, one module per op family.

Every constructor validates its inputs and raises a :class:`~ggopt.errors.GgoptError` at graph
construction time; nothing is computed here. Each op's backward rule sits beside it
(``@backward(Op.X)``), and ops with parameters carry a frozen dataclass in ``op_params``.
The families mirror the kernels in ``ggopt/_kernels`` and the compilers in
``ggopt/backend/{cpu,xp,cupy}_ops``: elementwise, reduce, softmax, linalg, conv, rows, optim,
views, and the transformer families norm, rope, attention (causal masks), pointwise (swiglu,
trig, add1).
"""

from __future__ import annotations

# Import order matters only for the one cycle (elementwise <-> reduce), which both sides
# resolve through module references at call time.
from ._base import BACKWARD, GradSink
from .attention import DiagMaskParams, diag_mask_inf, diag_mask_zero
from .conv import (  # noqa: I001
    OP_POOL_AVG,
    OP_POOL_MAX,
    Conv2DParams,
    Im2ColParams,
    PoolParams,
    conv_2d,
    conv_2d_back_input,
    conv_2d_back_kernel,
    conv_2d_direct,
    im2col,
    im2col_back,
    pool_2d,
    pool_2d_back,
)
from .elementwise import (
    ScaleParams,
    abs,
    add,
    add_inplace,
    div,
    exp,
    gelu,
    log,
    mul,
    neg,
    relu,
    scale,
    scale_inplace,
    sigmoid,
    silu,
    sqr,
    sqrt,
    step,
    sub,
    tanh,
)
from .flags import get_name, set_input, set_loss, set_name, set_output, set_param
from .linalg import mul_mat, out_prod
from .norm import NormParams, norm, norm_back, rms_norm, rms_norm_back
from .optim import opt_step_adamw, opt_step_sgd
from .order import MulMatParams, has_ggml_order, set_ggml_order
from .pointwise import (
    GluParams,
    add1,
    cos,
    silu_back,
    sin,
    swiglu,
    swiglu_split,
    swiglu_swapped,
)
from .reduce import argmax, count_equal, mean, repeat, repeat_back, sum, sum_rows
from .rope import ROPE_TYPE_NEOX, ROPE_TYPE_NORMAL, RopeParams, rope, rope_ext, rope_ext_back
from .rows import get_rows, get_rows_back
from .softmax import (
    CrossEntropyIdsParams,
    SoftMaxParams,
    cross_entropy_loss,
    cross_entropy_loss_back,
    cross_entropy_loss_ids,
    cross_entropy_loss_ids_back,
    soft_max,
    soft_max_ext,
    soft_max_ext_back,
)
from .views import (
    AccParams,
    ConcatParams,
    PermuteParams,
    ViewParams,
    acc,
    concat,
    cont,
    cpy,
    dup,
    permute,
    reshape,
    reshape_1d,
    reshape_2d,
    reshape_3d,
    reshape_4d,
    transpose,
    view_1d,
    view_2d,
    view_3d,
    view_4d,
)

__all__ = [
    "add", "add_inplace", "sub", "mul", "div", "scale", "scale_inplace", "sqr", "sqrt", "log",
    "neg", "exp", "abs", "sum", "sum_rows", "mean", "repeat", "repeat_back", "acc", "relu",
    "gelu", "silu", "tanh", "sigmoid", "step", "soft_max", "soft_max_ext", "mul_mat", "out_prod",
    "cross_entropy_loss", "cross_entropy_loss_back", "cross_entropy_loss_ids",
    "cross_entropy_loss_ids_back", "argmax", "count_equal", "get_rows",
    "get_rows_back", "im2col", "im2col_back", "conv_2d", "conv_2d_direct",
    "conv_2d_back_input", "conv_2d_back_kernel", "pool_2d", "pool_2d_back",
    "opt_step_adamw", "opt_step_sgd", "view_1d", "view_2d", "view_3d", "view_4d", "reshape",
    "reshape_1d", "reshape_2d", "reshape_3d", "reshape_4d", "permute", "transpose", "cont",
    "dup", "cpy", "set_input", "set_output", "set_param", "set_loss", "set_name", "get_name",
    "OP_POOL_MAX", "OP_POOL_AVG", "GradSink", "BACKWARD",
    # transformer ops
    "rms_norm", "rms_norm_back", "norm", "norm_back", "rope", "rope_ext", "rope_ext_back",
    "ROPE_TYPE_NORMAL", "ROPE_TYPE_NEOX", "soft_max_ext_back", "diag_mask_inf",
    "diag_mask_zero", "swiglu", "swiglu_swapped", "swiglu_split", "silu_back", "sin", "cos",
    "add1", "concat",
    # ggml's float order (llama.cpp's bits)
    "set_ggml_order", "has_ggml_order",
]

#: The typed parameters of the ops that have some (``Tensor.op_params``).
OP_PARAMS = (ScaleParams, SoftMaxParams, Im2ColParams, Conv2DParams, PoolParams, ViewParams,
             PermuteParams, AccParams, NormParams, RopeParams, DiagMaskParams, GluParams,
             ConcatParams, CrossEntropyIdsParams, MulMatParams)
