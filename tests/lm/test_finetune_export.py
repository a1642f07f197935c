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


def _realigned(src, dst, alignment: int) -> None:
    """``src`` rewritten with ``general.alignment = alignment`` (its data padded to it)."""
    from gguf import GGUFWriter

    r = GGUFReader(src)
    w = GGUFWriter(str(dst), "llama")
    w.add_custom_alignment(alignment)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", "general.alignment"):
            continue
        types = list(f.types)
        w.add_key_value(k, f.contents(), types[0],
                        types[-1] if types[0] == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        shape = tuple(int(d) for d in t.shape)[::-1]
        w.add_tensor(t.name, np.array(t.data), raw_shape=t.data.shape,
                     raw_dtype=GGMLQuantizationType(int(t.tensor_type)))
        assert shape  # every tensor has dimensions
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("out_type", ["f32", "keep", "q8_0"])
def test_general_alignment_is_honoured(tmp_path, src, out_type):
    """Issue 32 row 9: a model with general.alignment = 64 exported the key with the data
    padded to 32: neither ggopt nor llama.cpp could read the result."""
    aligned = tmp_path / "aligned.gguf"
    _realigned(src, aligned, 64)
    _, w, _ = llama.read_weights(aligned)
    dst = tmp_path / "out.gguf"
    export(aligned, dst, _changed(aligned), out_type)
    r = GGUFReader(dst)
    assert int(r.alignment) == 64 and int(r.fields["general.alignment"].contents()) == 64
    for t in r.tensors:
        assert (t.data_offset - r.data_offset) % 64 == 0
    _, back, _ = llama.read_weights(dst)
    assert set(back) == set(w)
    f32 = tmp_path / "f32.gguf"
    llama.write_f32(aligned, f32)
    _, back32, _ = llama.read_weights(f32)
    for k in w:
        np.testing.assert_array_equal(back32[k], w[k])


def test_written_file_is_read_back_before_it_replaces_the_target(tmp_path, src, monkeypatch):
    """A writer bug that leaves a tensor outside the file is caught on the temporary file:
    the target keeps its old content."""
    from gguf import GGUFWriter

    from ggopt.errors import ShapeError

    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"old")
    real = GGUFWriter.close

    def cut(self):  # the last tensor's end lost
        path = self.path
        real(self)
        with open(path, "r+b") as f:
            f.truncate(f.seek(0, 2) - 100)

    monkeypatch.setattr(GGUFWriter, "close", cut)
    with pytest.raises((ShapeError, InvalidValueError), match="read"):
        export(src, dst, _changed(src), "f32")
    assert dst.read_bytes() == b"old"


def _raw_fields(path) -> dict[str, object]:
    r = GGUFReader(path)
    out: dict[str, object] = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.file_type":
            continue
        out[k] = [bytes(p) for p in f.parts]  # the key's bytes in the file, all of them
    return out


def _odd_model(path, cfg) -> None:
    """A llama whose metadata has an empty array and a byte vocabulary with a raw 0xff token
    (both legal GGUF, which llama.cpp reads; the gguf package writes neither by itself)."""
    from gguf import GGUFWriter

    from tests.support.llama_files import keys, random_weights

    class EmptyArrays(GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if vtype == GGUFValueType.ARRAY and len(val) == 0:
                return (self._pack("I", vtype) if add_vtype else b"") + \
                    self._pack("I", sub_type) + self._pack("Q", 0)
            return super()._pack_val(val, vtype, add_vtype, sub_type)

    w = EmptyArrays(str(path), "llama")
    for key, (value, vtype) in keys(cfg).items():
        w.add_key_value(key, value, vtype)
    w.add_key_value("tokenizer.ggml.model", "rwkv", GGUFValueType.STRING)
    tokens = [t.encode() for t in llama.byte_tokens()]
    tokens[255] = b"\xff"
    w.add_key_value("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_key_value("general.tags", [], GGUFValueType.ARRAY, GGUFValueType.STRING)
    for name, arr in random_weights(llama.param_shapes(cfg), 3).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_keys_the_gguf_package_cannot_write_are_copied(tmp_path):
    """Issue 32 rows 10 and 12: a model with an empty-array key or a non-UTF-8 token trained a
    whole run, then the export died with a raw ValueError / UnicodeDecodeError (and llama.load
    refused the 0xff token with a raw UnicodeDecodeError). Both are copied byte for byte."""
    from ggopt.lm.export import check_exportable
    from ggopt.models.llama import weight_map

    src = tmp_path / "odd.gguf"
    _odd_model(src, CFG)
    fields = _raw_fields(src)
    assert fields["general.tags"][3:] == [b"\x08\x00\x00\x00", bytes(8)]  # [] of STRING
    assert fields["tokenizer.ggml.tokens"][-1] == b"\xff"
    model = llama.load(src, progress=False)
    assert model.require_tokenizer().decode([255]) == b"\xff"
    check_exportable(src)
    for out_type in ("f32", "keep"):
        dst = tmp_path / f"out-{out_type}.gguf"
        export(src, dst, weight_map(model.net), out_type)
        assert _raw_fields(dst) == fields
        llama.load(dst, progress=False)
    f32 = tmp_path / "f32.gguf"
    llama.write_f32(src, f32)
    assert _raw_fields(f32) == fields


def test_nested_array_keys_are_refused_not_a_recursion_error(tmp_path):
    """Issue 32 row 12: a key of 5000 nested arrays raised a raw RecursionError in
    llama.load and lora.load."""
    import struct

    from ggopt.errors import ShapeError

    path = tmp_path / "nested.gguf"
    key = b"general.nested"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)
    kv += struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv)
    with pytest.raises(ShapeError, match="not a readable GGUF"):
        llama.load(path, progress=False)
    with pytest.raises(ShapeError, match="not a readable GGUF"):
        llama.load(path, base_type="keep", progress=False)


@pytest.mark.parametrize("size, lossy", [(1e-4, True), (0.2, False)])
def test_the_share_of_the_change_kept_is_measured(tmp_path, src, size, lossy):
    """Issue 34: a change below the Q4_1 step is re-quantized away (keep); the report measures
    the share kept and warns with the number; F32 keeps all (nothing to measure)."""
    _, w, _ = llama.read_weights(src)
    w = dict(w)
    name = "blk.1.ffn_up.weight"  # Q4_1 in the file
    rng = np.random.default_rng(0)
    w[name] = w[name] + (size * rng.standard_normal(w[name].shape)).astype(np.float32)
    rep = export(src, tmp_path / "keep.gguf", w, "keep")
    assert rep.requantized == [name] and rep.lossy == {"Q4_1"}
    _, back, _ = llama.read_weights(tmp_path / "keep.gguf")
    old = llama.read_weights(src)[1][name].astype(np.float64)
    delta = w[name] - old
    want = float(np.vdot(back[name] - old, delta) / np.vdot(delta, delta))
    assert rep.change_kept == pytest.approx(want, rel=1e-6)
    warning = rep.loss_warning()
    if lossy:
        assert rep.change_kept < 0.5
        assert warning is not None and f"keep {100 * rep.change_kept:.0f}% of the" in warning
        assert f"{100 * rep.change_kept:.0f}% of the change kept" in rep.summary()
    else:
        assert rep.change_kept > 0.9 and warning is None
    full = export(src, tmp_path / "f32.gguf", w, "f32")
    assert full.change_kept is None and full.loss_warning() is None
    assert full.summary() == "ALL_F32"


def test_a_chat_template_replaces_the_files_and_every_other_key_is_kept(tmp_path):
    src = tmp_path / "in.gguf"
    write(src, CFG, key_overrides={"tokenizer.chat_template": ("{{ old }}",
                                                               GGUFValueType.STRING)})
    w = _changed(src)
    export(src, tmp_path / "same.gguf", w)
    assert _fields(tmp_path / "same.gguf")["tokenizer.chat_template"][1] == "{{ old }}"
    export(src, tmp_path / "new.gguf", w, chat_template="{{ new }}")
    want, got = _fields(src), _fields(tmp_path / "new.gguf")
    assert got.pop("tokenizer.chat_template") == ([GGUFValueType.STRING], "{{ new }}")
    want.pop("tokenizer.chat_template")
    assert got == want
    with pytest.raises(InvalidValueError, match="chat_template must be a non-empty str"):
        export(src, tmp_path / "bad.gguf", w, chat_template="")
    assert not (tmp_path / "bad.gguf").exists()
