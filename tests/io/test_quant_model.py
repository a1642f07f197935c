"""The shipped SmolLM2-135M Q4_1 file (210 Q4_1 tensors, token_embd Q8_0): read without
dequantizing, written back byte for byte, and its real weights through the quantized kernels
equal to the gguf-dequantized F32 computation."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as GQT

import ggopt
from ggopt import backend as gb
from ggopt.backend.array.ops.quant import int_product
from ggopt.io import gguf as ggio
from ggopt.quants import Blocks, tensor_from_blocks
from ggopt.types import F32, GGType

MODEL = Path(os.environ.get("GGOPT_CACHE", Path.home() / ".cache/ggopt")) / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not MODEL.is_file(), reason=f"the SmolLM2 Q4_1 file is not at {MODEL}"),
]


@pytest.fixture(scope="module")
def model():
    return ggio.load_blocks(MODEL)


def test_the_file_loads_as_blocks_and_plain_load_refuses_it(model):
    _, tensors = model
    kinds = {name: (t.type if isinstance(t, Blocks) else F32) for name, t in tensors.items()}
    assert sum(k is GGType.Q4_1 for k in kinds.values()) == 210
    assert kinds["token_embd.weight"] is GGType.Q8_0
    assert tensors["token_embd.weight"].shape == (49152, 576)
    with pytest.raises(ggopt.DTypeError, match="load_blocks"):
        ggio.load(MODEL)


def test_blocks_are_written_back_byte_for_byte(model, tmp_path):
    _, tensors = model
    subset = {k: tensors[k] for k in ("blk.0.ffn_up.weight", "blk.0.attn_norm.weight",
                                      "token_embd.weight")}
    out = tmp_path / "subset.gguf"
    ggio.save(out, subset, {"general.architecture": "llama"})
    original = {t.name: t for t in GGUFReader(MODEL).tensors}
    for t in GGUFReader(out).tensors:
        assert t.tensor_type == original[t.name].tensor_type
        assert list(t.shape) == list(original[t.name].shape)
        np.testing.assert_array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                                      np.asarray(original[t.name].data).view(np.uint8).reshape(-1))


def test_real_weights_through_the_kernels(model):
    _, tensors = model
    up, emb = tensors["blk.0.ffn_up.weight"], tensors["token_embd.weight"]
    assert isinstance(up, Blocks) and isinstance(emb, Blocks)
    ids = np.array([1, 504, 2, 49151], np.int32)
    ctx = ggopt.Context()
    w_up = tensor_from_blocks(ctx, up.type, up.shape[::-1], up.data, "ffn_up")
    w_emb = tensor_from_blocks(ctx, emb.type, emb.shape[::-1], emb.data, "token_embd")
    t_ids = ctx.new_tensor(GGType.I32, (4,))
    ggopt.set_input(t_ids)
    h = ggopt.get_rows(ctx, w_emb, t_ids)
    y = ggopt.mul_mat(ctx, w_up, h)
    logits = ggopt.mul_mat(ctx, w_emb, h)  # the tied output head
    gf = ggopt.new_graph_custom(ctx, 64, False)
    for t in (h, y, logits):
        ggopt.set_output(t)
        ggopt.build_forward_expand(gf, t)
    cpu = gb.cpu_init(2)
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(t_ids, ids)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    e = gq.dequantize(emb.data[ids], GQT.Q8_0)
    np.testing.assert_array_equal(h.numpy(), e)
    # ggml's integer products (the activations rounded to 8 bits): the NumPy port's bits
    np.testing.assert_array_equal(y.numpy(), int_product(np.asarray(up.data), 3, e))
    np.testing.assert_array_equal(logits.numpy(), int_product(np.asarray(emb.data), 8, e))
