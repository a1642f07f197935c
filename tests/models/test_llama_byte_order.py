"""A big-endian llama GGUF loads with base_type='f32' and exports (keep included) as this
machine's byte order."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from ggopt.lm.export import export
from ggopt.models import llama
from tests.support.llama_files import write

CFG = llama.Config(n_ctx=32, n_embd=32, n_layer=1, n_head=4, n_head_kv=2, n_ff=64)
TYPES = {"blk.0.attn_q.weight": Q.Q8_0, "blk.0.attn_k.weight": Q.F16}


def test_big_endian_file_loads_and_exports(tmp_path):
    """The F32 tensors came back as '>f4' arrays: load failed in tensor_set ("the array is
    >f4") and export's keep copied big-endian bytes into a little-endian file (NaNs)."""
    src = tmp_path / "big.gguf"
    written = write(src, CFG, types=TYPES, big_endian=True)
    got = llama.get_weights(llama.load(src, progress=False).net)
    assert all(np.array_equal(got[k], written[k]) for k in written)
    _, weights, _ = llama.read_weights(src)
    for out_type in ("f32", "keep"):
        dst = tmp_path / f"{out_type}.gguf"
        export(src, dst, weights, out_type)
        _, back, _ = llama.read_weights(dst)
        assert all(np.array_equal(back[k], written[k]) for k in written), out_type
