"""Bad LoRA adapters and arguments refused with a GgoptError before anything is made; an
alpha of 0 scales by 1, as llama.cpp reads it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter

from ggopt.backend import tensor_fill
from ggopt.errors import DTypeError, InvalidValueError, ShapeError
from ggopt.lm import lora
from ggopt.models import llama
from tests.support.finetune import CFG, tiny

Q = "blk.0.attn_q.weight"
N = CFG.n_embd


def _adapter_file(path, tensors: dict[str, np.ndarray], alpha: float = 8.0) -> str:
    w = GGUFWriter(str(path), "llama")
    w.add_key_value("general.type", "adapter", GGUFValueType.STRING)
    w.add_key_value("adapter.type", "lora", GGUFValueType.STRING)
    w.add_key_value("adapter.lora.alpha", alpha, GGUFValueType.FLOAT32)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _pair(base: str, r: int = 2, n_out: int = N, n_in: int = N, fill: float | None = None):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((r, n_in)).astype(np.float32)
    b = rng.standard_normal((n_out, r)).astype(np.float32)
    if fill is not None:
        a[:] = fill
    return {base + ".lora_a": a, base + ".lora_b": b}


@pytest.mark.parametrize("tensors, exc, match", [
    ({}, ShapeError, "no tensors"),
    (_pair(Q, r=0), ShapeError, "r >= 1"),  # was a ZeroDivisionError in scale()
    # token_embd is 2-D but no graph applies an adapter to it: training ignored it, merged not
    (_pair("token_embd.weight", n_out=CFG.n_vocab), ShapeError, "adapts no weight ggopt"),
    (_pair(Q, fill=np.nan), InvalidValueError, "NaN or infinite"),
])
def test_bad_adapter_tensors(tmp_path, tensors, exc, match):
    path = _adapter_file(tmp_path / "ad.gguf", tensors)
    with pytest.raises(exc, match=match):
        lora.load(path, tiny())


@pytest.mark.parametrize("alpha", [float("nan"), float("inf")])
def test_non_finite_alpha_in_the_file(tmp_path, alpha):
    path = _adapter_file(tmp_path / "ad.gguf", _pair(Q), alpha)
    with pytest.raises(InvalidValueError, match="adapter.lora.alpha"):
        lora.load(path, tiny())


def test_alpha_zero_scales_by_one_as_llama_cpp(tmp_path):
    """llama.cpp: ``scale = alpha ? alpha / rank : 1``; it was 0 here (the adapter ignored)."""
    net = tiny()
    ad = lora.load(_adapter_file(tmp_path / "ad.gguf", _pair(Q), 0.0), net)
    assert ad.scale(Q) == 1.0
    w = llama.get_weights(net)
    a, b = ad.arrays()[Q]
    expected = (w[Q].astype(np.float64) + b.astype(np.float64) @ a).astype(np.float32)
    assert np.array_equal(lora.merged(w, ad)[Q], expected)


@pytest.mark.parametrize("alpha, exc", [(1e39, InvalidValueError), (1e-50, InvalidValueError),
                                        ("8", DTypeError), (None, DTypeError)])
def test_create_checks_alpha_in_float32(alpha, exc):
    """1e39 was stored as inf (a NaN model), 1e-50 as 0 (llama.cpp's scale 1)."""
    with pytest.raises(exc, match="alpha"):
        lora.create(tiny(), 2, alpha)


@pytest.mark.parametrize("kwargs, exc", [({"seed": -1}, InvalidValueError),
                                         ({"targets": [3]}, DTypeError),
                                         ({"targets": 3}, DTypeError)])
def test_create_bad_seed_and_targets(kwargs, exc):
    with pytest.raises(exc):
        lora.create(tiny(), 2, 8.0, **kwargs)


def test_merged_with_other_weights():
    net = tiny()
    ad = lora.create(net, 2, 8.0, ["attn_q"])
    w = llama.get_weights(net)
    with pytest.raises(ShapeError, match="blk.0.attn_q.weight"):
        lora.merged({k: v for k, v in w.items() if k != Q}, ad)
    with pytest.raises(ShapeError, match=r"\(32, 32\).*got \(64, 64\)"):
        lora.merged({**w, Q: np.zeros((64, 64), np.float32)}, ad)[Q]


def test_save_refuses_a_diverged_adapter(tmp_path):
    net = tiny()
    ad = lora.create(net, 2, 8.0, ["attn_q"])
    tensor_fill(ad.b[Q], float("nan"))
    out = tmp_path / "ad.gguf"
    out.write_bytes(b"old")
    with pytest.raises(InvalidValueError, match="diverged"):
        lora.save(out, ad)
    assert out.read_bytes() == b"old"


def test_attach_an_adapter_of_another_model():
    """The base was frozen first and the mismatch surfaced only in the graph's mul_mat."""
    other = tiny(llama.Config(n_ctx=16, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=48,
                              n_vocab=64, tied_output=True))
    net = tiny()
    with pytest.raises(ShapeError, match="does not fit this model's weight"):
        lora.attach(net, lora.create(other, 2, 8.0))
    assert net.projection is None and all(t.is_param for t in net.params.values())
    with pytest.raises(DTypeError, match="LoraAdapter"):
        lora.attach(net, "adapter.gguf")


@pytest.mark.parametrize("call", [
    lambda: lora.load(5, tiny()), lambda: lora.save(b"ad.gguf", lora.create(tiny(), 2, 8.0)),
    lambda: llama.load(3.0), lambda: llama.read_weights(None),
])
def test_paths_of_the_wrong_type(call):
    """A path that is not a str or os.PathLike was a raw TypeError from os.fspath."""
    with pytest.raises(DTypeError, match="expected a path"):
        call()


def test_attach_an_adapter_whose_halves_disagree():
    """A lora_b missing or of another rank than its lora_a was a KeyError or a late mul_mat
    error after the base was frozen."""
    net = tiny()
    ad = lora.create(net, 2, 8.0, ["attn_q"])
    other = lora.create(net, 3, 8.0, ["attn_q"])
    right = dict(ad.b)
    for wrong in ({}, {Q: other.b[Q]}):
        ad.b.clear()
        ad.b.update(wrong)
        with pytest.raises(ShapeError, match="needs a lora_b of rank 2"):
            lora.attach(net, ad)
        assert net.projection is None and all(t.is_param for t in net.params.values())
    ad.b.update(right)
    lora.attach(net, ad)
    assert net.projection is not None
