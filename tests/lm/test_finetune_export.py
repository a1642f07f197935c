"""Exporting a fine-tuned llama: every key kept, --out-type, keep's original bytes."""

from __future__ import annotations

import tracemalloc
from collections.abc import Mapping

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, LlamaFileType

from ggopt.errors import DTypeError, InvalidValueError
from ggopt.lm.export import export
from ggopt.models import llama
from tests.support.llama_files import write

Q = GGMLQuantizationType
CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=256)


def _fields(path) -> dict[str, object]:
    r = GGUFReader(path)
    return {k: (list(f.types), f.contents()) for k, f in r.fields.items()
            if not k.startswith("GGUF.") and k != "general.file_type"}


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "in.gguf"
    types = {"blk.0.attn_q.weight": Q.Q8_0, "blk.1.ffn_up.weight": Q.Q4_1,
             "blk.0.ffn_down.weight": Q.Q4_K, "blk.1.attn_k.weight": Q.F16}
    write(path, CFG, types=types, key_overrides={"general.name": ("tiny", GGUFValueType.STRING)})
    return path


def _changed(path) -> dict[str, np.ndarray]:
    _, w, _ = llama.read_weights(path)
    w = dict(w)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.attn_norm.weight"):
        w[name] = w[name] + np.float32(0.01)
    return w


@pytest.mark.parametrize("out_type, qtype, ftype", [
    ("f32", Q.F32, LlamaFileType.ALL_F32), ("f16", Q.F16, LlamaFileType.MOSTLY_F16),
    ("bf16", Q.BF16, LlamaFileType.MOSTLY_BF16), ("q8_0", Q.Q8_0, LlamaFileType.MOSTLY_Q8_0)])
def test_out_types_keep_every_key(tmp_path, src, out_type, qtype, ftype):
    w = _changed(src)
    dst = tmp_path / "out.gguf"
    export(src, dst, w, out_type)
    assert _fields(dst) == _fields(src)
    r = GGUFReader(dst)
    assert int(r.fields["general.file_type"].contents()) == int(ftype)
    for t in r.tensors:
        want = Q.F32 if len(t.shape) == 1 else qtype
        assert int(t.tensor_type) == int(want), t.name
    _, back, _ = llama.read_weights(dst)
    tol = {"f32": 0, "f16": 1e-3, "bf16": 1e-2, "q8_0": 2e-2}[out_type]
    for k in w:
        np.testing.assert_allclose(back[k], w[k], atol=tol * max(1.0, np.abs(w[k]).max()))
    assert [t.name for t in r.tensors] == [t.name for t in GGUFReader(src).tensors]


def test_keep_copies_unchanged_bytes_and_requantizes_changed(tmp_path, src):
    w = _changed(src)
    dst = tmp_path / "out.gguf"
    rep = export(src, dst, w, "keep")
    assert sorted(rep.requantized) == ["blk.0.attn_q.weight", "blk.1.attn_norm.weight"]
    assert rep.as_f16 == ["blk.0.ffn_down.weight"]  # Q4_K: gguf has no quantizer
    assert _fields(dst) == _fields(src)
    a = {t.name: t for t in GGUFReader(src).tensors}
    b = {t.name: t for t in GGUFReader(dst).tensors}
    for name in a:
        if name in rep.kept:
            assert a[name].tensor_type == b[name].tensor_type
            assert np.asarray(a[name].data).tobytes() == np.asarray(b[name].data).tobytes()
    assert int(b["blk.0.attn_q.weight"].tensor_type) == int(Q.Q8_0)
    assert int(b["blk.0.ffn_down.weight"].tensor_type) == int(Q.F16)
    assert len(rep.kept) == len(a) - 3


def test_bad_export(tmp_path, src):
    w = _changed(src)
    with pytest.raises(InvalidValueError, match="out-type"):
        export(src, tmp_path / "o.gguf", w, "q4_k")
    del w["blk.1.ffn_up.weight"]
    with pytest.raises(InvalidValueError, match="ffn_up"):
        export(src, tmp_path / "o.gguf", w, "f32")
    assert not (tmp_path / "o.gguf").exists()


class _Counting(Mapping):
    """Weights computed on access, counting each look-up; ``refuse`` names raise."""

    def __init__(self, weights, refuse=()):
        self.weights, self.refuse = weights, set(refuse)
        self.calls: dict[str, int] = {}

    def __getitem__(self, name):
        if name in self.refuse:
            raise AssertionError(f"{name} was read")
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.weights[name].copy()

    def __contains__(self, name):
        return name in self.weights

    def __iter__(self):
        return iter(self.weights)

    def __len__(self):
        return len(self.weights)


@pytest.mark.parametrize("out_type", ["f16", "keep"])
def test_lazy_weights_write_the_same_bytes_one_tensor_at_a_time(tmp_path, src, out_type):
    w = _changed(src)
    export(src, tmp_path / "dict.gguf", w, out_type)
    lazy = _Counting(w)
    export(src, tmp_path / "lazy.gguf", lazy, out_type)
    assert (tmp_path / "lazy.gguf").read_bytes() == (tmp_path / "dict.gguf").read_bytes()
    assert set(lazy.calls) == set(w) and max(lazy.calls.values()) <= 2


def test_unchanged_names_are_copied_without_reading_them(tmp_path, src):
    w = _changed(src)
    touched = {"blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.attn_norm.weight"}
    rest = set(w) - touched
    rep = export(src, tmp_path / "out.gguf", _Counting(w, refuse=rest), "keep", rest)
    assert set(rep.kept) == rest
    export(src, tmp_path / "ref.gguf", w, "keep")
    assert (tmp_path / "out.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()


def test_export_holds_one_tensor_not_the_model(tmp_path):
    """A lazy source of 40 same-size weights: the export's peak allocation is a few tensors'
    worth, not the model's (NumPy reports its buffers to tracemalloc)."""
    cfg = llama.Config(n_ctx=64, n_embd=256, n_layer=8, n_head=4, n_head_kv=4, n_ff=256,
                       n_vocab=256)
    path = tmp_path / "in.gguf"
    write(path, cfg)
    _, w, _ = llama.read_weights(path)
    w = {k: v + np.float32(0.5) for k, v in w.items()}
    total = sum(v.nbytes for v in w.values())
    largest = max(v.nbytes for v in w.values())
    lazy = _Counting(w)
    tracemalloc.start()
    try:
        export(path, tmp_path / "out.gguf", lazy, "f32")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < total / 4 and peak >= largest, (peak, total, largest)


def test_weight_map_dequantizes_each_weight_on_access(src):
    net = llama.load(src, progress=False, base_type="keep").net
    _, want, _ = llama.read_weights(src)
    lazy = llama.weight_map(net)
    assert list(lazy) == list(llama.get_weights(net)) and len(lazy) == len(want)
    for k in want:
        np.testing.assert_array_equal(lazy[k], want[k])


@pytest.mark.parametrize("out_type, scale, match", [
    ("f32", np.nan, "training diverged"), ("f16", 1e6, "exceeds F16's range"),
    ("q8_0", 1e9, "exceed Q8_0's range"),
])
def test_non_finite_output_is_refused(tmp_path, src, out_type, scale, match):
    """A diverged run (NaN) or values beyond the output type's range were written as a file
    that llama.load refuses; now an error, and an existing output is left as it was."""
    _, w, _ = llama.read_weights(src)
    name = "blk.1.ffn_up.weight"
    w = {**w, name: w[name] * np.float32(scale) if np.isfinite(scale) else
         np.full_like(w[name], scale)}
    dst = tmp_path / "o.gguf"
    dst.write_bytes(b"old")
    with pytest.raises(InvalidValueError, match=match):
        export(src, dst, w, out_type)
    assert dst.read_bytes() == b"old"


def test_weights_of_the_wrong_type(tmp_path, src):
    _, w, _ = llama.read_weights(src)
    name = "output_norm.weight"
    with pytest.raises(DTypeError, match="mapping"):
        export(src, tmp_path / "o.gguf", list(w.values()))
    with pytest.raises(InvalidValueError, match="got list"):
        export(src, tmp_path / "o.gguf", {**w, name: list(w[name])})
    with pytest.raises(DTypeError, match="must be float32, got complex64"):
        export(src, tmp_path / "o.gguf", {**w, name: w[name].astype(np.complex64)})
    assert not (tmp_path / "o.gguf").exists()
