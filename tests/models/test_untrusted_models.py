"""The sweep of issue 32 over what this round's loader reads: K-quant, Q8_0 and BF16 blocks
whose scales are NaN or infinite, and qwen2 / qwen3 / gemma3 files with a tensor missing,
misshaped or foreign. Each is a GgoptError at load naming the tensor, and nothing else escapes
(no NumPy RuntimeWarning on the way)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ggopt.errors import GgoptError, InvalidValueError, ShapeError
from ggopt.io.gguf_reader import open_gguf
from ggopt.models import llama
from tests.support.families import FAMILIES, peaked_weights
from tests.support.llama_files import Q, write

CFG = llama.Config(n_ctx=32, n_embd=256, n_layer=1, n_head=2, n_head_kv=2, n_ff=256)
NAME = "blk.0.ffn_up.weight"
_SCALE_AT = {Q.Q4_K: 0, Q.Q5_K: 0, Q.Q6_K: 208, Q.Q8_0: 0}  # byte offset of the block's f16 scale d


def _poisoned(path, qtype, value: float) -> None:
    """A model whose NAME is stored as ``qtype`` with one scale (BF16: one value) ``value``."""
    write(path, CFG, types={NAME: qtype})
    t = next(t for t in open_gguf(path).tensors if t.name == NAME)
    raw = bytearray(path.read_bytes())
    if qtype == Q.BF16:
        bits = np.array([value], np.float32).view(np.uint32) >> 16
        raw[t.data_offset + 6:t.data_offset + 8] = bits.astype(np.uint16).tobytes()
    else:
        at = t.data_offset + _SCALE_AT[qtype]  # the first block's
        raw[at:at + 2] = np.array([value], np.float16).tobytes()
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("mode", [{}, {"base_type": "keep"}, {"compute_type": "bf16"}],
                         ids=["f32", "keep", "bf16"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.BF16],
                         ids=lambda q: q.name)
def test_non_finite_scales_are_refused_at_load(tmp_path, qtype, value, mode):
    """llama.cpp computes with such blocks and every logit comes out NaN; ggopt refuses the
    file at load, as it refuses a NaN F32 weight (a K-quant's dequantization once also
    printed NumPy's 'invalid value encountered in multiply' on the way)."""
    path = tmp_path / "bad.gguf"
    _poisoned(path, qtype, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidValueError, match=f"{NAME}.*(NaN or infinite)"):
            llama.load(path, progress=False, **mode)


_DAMAGE = {  # family -> (tensor, what is done to it)
    "qwen2": ("blk.1.attn_k.bias", "drop"),
    "qwen3": ("blk.1.attn_q_norm.weight", "drop"),
    "gemma3": ("blk.2.post_ffw_norm.weight", "drop"),
}


@pytest.mark.parametrize("arch", list(FAMILIES))
@pytest.mark.parametrize("damage", ["drop", "misshape", "foreign"])
def test_family_files_with_a_damaged_tensor_are_refused_by_name(tmp_path, arch, damage):
    cfg = FAMILIES[arch]
    name = _DAMAGE[arch][0]
    w = peaked_weights(cfg)
    path = tmp_path / f"{arch}.gguf"
    if damage == "drop":
        write(path, cfg, weights=w, drop=(name,))
        match = f"missing tensor.*{name}"
    elif damage == "misshape":
        w[name] = np.ones(w[name].shape[0] - 2, np.float32)
        write(path, cfg, weights=w)
        match = f"{name}.*expected ggml shape"
    else:  # a tensor another family has
        write(path, cfg, weights=w, extra={"blk.0.ffn_gate_inp.weight": np.ones((4, 64),
                                                                                  np.float32)})
        match = "unexpected tensor.*ffn_gate_inp"
    with pytest.raises(ShapeError, match=match):
        llama.load(path, progress=False)
    with pytest.raises(GgoptError):
        llama.load(path, base_type="keep", progress=False)
