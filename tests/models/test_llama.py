"""ggopt.models.llama: llama GGUFs as converters write them (every tensor type the gguf package
dequantizes, tied output, rope scaling, keys of llama.cpp's types) load and give the float64
reference's logits; every malformed file is refused with a GgoptError naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

import ggopt
from ggopt.errors import DTypeError, GgoptError, InvalidValueError, ShapeError
from ggopt.models import llama
from tests.support.llama_files import Q, V, write
from tests.support.llm_ref import logits as ref_logits

CFG = llama.Config(n_ctx=32, n_embd=256, n_layer=1, n_head=4, n_head_kv=2, n_ff=256)
SMALL = llama.Config(n_ctx=24, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48)
IDS = np.array([3, 250, 17, 0, 99, 128, 7, 64, 200, 1, 33])
MATRIX_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                Q.F16, Q.BF16]


def _matrices(cfg: llama.Config) -> list[str]:
    return [n for n, s in llama.param_shapes(cfg).items() if len(s) == 2]


@pytest.mark.parametrize("shift", [0, 4, 8])
def test_every_tensor_type_loads_and_matches_reference(tmp_path, shift):
    names = _matrices(CFG)
    kinds = MATRIX_TYPES[shift:] + MATRIX_TYPES[:shift]
    types = dict(zip(names, kinds, strict=False))
    path = tmp_path / "q.gguf"
    w = write(path, CFG, types=types)
    model = llama.load(path, progress=False)
    assert sum(model.tensor_types.values()) == len(w)
    assert set(model.tensor_types) == {"F32", *(t.name for t in types.values())}
    want = ref_logits(model.cfg, w, IDS)
    got = llama.logits(model, IDS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_tied_output_uses_token_embd_and_vocab_size_from_tokens(tmp_path):
    path = tmp_path / "tied.gguf"
    w = write(path, SMALL, drop=("output.weight",), key_overrides={"llama.vocab_size": None})
    model = llama.load(path, progress=False)
    assert model.cfg.tied_output and model.cfg.n_vocab == 256
    assert "output.weight" not in model.net.params
    w.pop("output.weight", None)
    np.testing.assert_allclose(llama.logits(model, IDS), ref_logits(model.cfg, w, IDS),
                               rtol=1e-4, atol=1e-4)


def test_rope_freqs_and_linear_scaling_as_llama_cpp(tmp_path):
    # Frequency factors all equal to c divide every angle by c: the same as linear scaling by
    # c (freq_scale 1/c). Both differ from the unscaled model.
    hd = SMALL.head_dim
    factors = {"rope_freqs.weight": np.full(hd // 2, 4.0, np.float32)}
    plain, freqs, linear = (tmp_path / f"{n}.gguf" for n in ("plain", "freqs", "linear"))
    write(plain, SMALL)
    write(freqs, SMALL, extra=factors)
    write(linear, SMALL, key_overrides={"llama.rope.scaling.type": ("linear", V.STRING),
                                        "llama.rope.scaling.factor": (4.0, V.FLOAT32)})
    out = {p.stem: llama.logits(llama.load(p, progress=False), IDS) for p in
           (plain, freqs, linear)}
    assert llama.load(freqs, progress=False).cfg.rope_freqs
    assert llama.load(linear, progress=False).cfg.freq_scale == 0.25
    np.testing.assert_allclose(out["freqs"], out["linear"], rtol=1e-5, atol=1e-5)
    assert np.abs(out["freqs"] - out["plain"]).max() > 1e-2
    # Positions 0 and 1 of one token: rope leaves position 0 alone either way.
    np.testing.assert_allclose(out["freqs"][0], out["plain"][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["yarn", "longrope"])
def test_unsupported_rope_scaling_is_refused(tmp_path, kind):
    path = tmp_path / "y.gguf"
    write(path, SMALL, key_overrides={"llama.rope.scaling.type": (kind, V.STRING),
                                      "llama.rope.scaling.factor": (4.0, V.FLOAT32)})
    with pytest.raises(InvalidValueError, match=f"rope.scaling.type = '{kind}'"):
        llama.load(path)


# Keys of the wrong type were loaded and run ("8" refused as "expected 8,
# got 8"); llama.cpp's types are now enforced with messages naming the types.
@pytest.mark.parametrize("key,value,found,expected", [
    ("llama.context_length", ("64", V.STRING), "str", "u32"),
    ("llama.context_length", (64.0, V.FLOAT32), "f32", "u32"),
    ("llama.context_length", (True, V.BOOL), "bool", "u32"),
    ("llama.context_length", (64, V.INT32), "i32", "u32"),
    ("llama.rope.dimension_count", ("8", V.STRING), "str", "u32"),
    ("llama.attention.layer_norm_rms_epsilon", (1e-5, V.FLOAT64), "f64", "f32"),
    ("llama.rope.freq_base", (10000, V.UINT32), "u32", "f32"),
    ("llama.embedding_length", (32, V.UINT64), "u64", "u32"),
])
def test_key_of_wrong_type_names_key_and_types(tmp_path, key, value, found, expected):
    path = tmp_path / "k.gguf"
    write(path, SMALL, key_overrides={key: value})
    with pytest.raises(DTypeError) as exc:
        llama.load(path)
    assert f"key {key} has type {found}, expected {expected}" in str(exc.value)


@pytest.mark.parametrize("key,value,match", [
    ("llama.rope.freq_base", (float("inf"), V.FLOAT32), "rope.freq_base = inf"),
    ("llama.attention.layer_norm_rms_epsilon", (float("nan"), V.FLOAT32), "nan"),
    ("llama.rope.freq_base", (-1.0, V.FLOAT32), "freq_base must be a finite number > 0"),
    ("llama.rope.dimension_count", (4, V.UINT32), "rope.dimension_count = 4"),
    ("llama.attention.head_count", (5, V.UINT32), "head_count = 5 must divide"),
    ("llama.block_count", None, "missing key llama.block_count"),
    ("llama.expert_count", (8, V.UINT32), "mixture of experts"),
    ("llama.attention.head_count", ([4, 2], V.ARRAY), "per-layer values"),
])
def test_key_with_bad_value_is_refused(tmp_path, key, value, match):
    path = tmp_path / "k.gguf"
    write(path, SMALL, key_overrides={key: value})
    with pytest.raises(GgoptError, match=match):
        llama.load(path)


def test_per_layer_key_arrays_with_one_value_load(tmp_path):
    path = tmp_path / "arr.gguf"
    write(path, SMALL, key_overrides={"llama.attention.head_count": ([4, 4], V.ARRAY)})
    assert llama.load(path, progress=False).cfg.n_head == 4


@pytest.mark.parametrize("case", ["arch", "missing", "shape", "type", "extra", "truncated",
                                  "nan", "garbage", "absent"])
def test_malformed_files_are_refused_naming_the_problem(tmp_path, case):
    path = tmp_path / "bad.gguf"
    match = {"arch": "general.architecture 'gpt2' is not supported",
             "missing": "missing tensor.*blk.1.ffn_up.weight",
             "shape": "tensor 'blk.0.attn_k.weight': expected ggml shape \\[32, 16\\], got",
             "type": "tensor 'blk.0.attn_q.weight' has type F64",
             "extra": "unexpected tensor.*blk.2.attn_q.weight",
             "truncated": "truncated",
             "nan": "tensor 'blk.1.ffn_down.weight' holds 1 NaN",
             "garbage": "not a readable GGUF",
             "absent": "no such file"}[case]
    if case == "arch":
        write(path, SMALL, arch="gpt2")
    elif case == "missing":
        write(path, SMALL, drop=("blk.1.ffn_up.weight",))
    elif case == "shape":
        w = write(tmp_path / "ok.gguf", SMALL)
        w["blk.0.attn_k.weight"] = w["blk.0.attn_k.weight"][:8]
        write(path, SMALL, weights=w)
    elif case == "type":
        w = write(tmp_path / "ok.gguf", SMALL)
        w["blk.0.attn_q.weight"] = w["blk.0.attn_q.weight"].astype(np.float64)
        write(path, SMALL, weights=w)
    elif case == "extra":
        write(path, SMALL, extra={"blk.2.attn_q.weight": np.zeros((32, 32), np.float32)})
    elif case == "truncated":
        write(tmp_path / "ok.gguf", SMALL)
        data = (tmp_path / "ok.gguf").read_bytes()
        path.write_bytes(data[:len(data) - 1000])
    elif case == "nan":
        w = write(tmp_path / "ok.gguf", SMALL)
        w["blk.1.ffn_down.weight"][3, 5] = np.nan
        write(path, SMALL, weights=w)
    elif case == "garbage":
        path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(GgoptError, match=match):
        llama.load(path)


def test_load_failure_midway_leaves_the_scheduler_usable(tmp_path):
    # The NaN is found while copying: the half-filled weights are dropped with the model and
    # the same scheduler loads a good file afterwards.
    sched = ggopt.backend.Scheduler([ggopt.backend.cpu_init()])
    w = write(tmp_path / "ok.gguf", SMALL)
    bad = dict(w)
    bad["output_norm.weight"] = np.full_like(w["output_norm.weight"], np.inf)
    write(tmp_path / "bad.gguf", SMALL, weights=bad)
    with pytest.raises(InvalidValueError, match="output_norm.weight"):
        llama.load(tmp_path / "bad.gguf", sched)
    model = llama.load(tmp_path / "ok.gguf", sched, progress=False)
    np.testing.assert_allclose(llama.logits(model, IDS), ref_logits(model.cfg, w, IDS),
                               rtol=1e-4, atol=1e-4)


def test_progress_bar_and_load_time(tmp_path):
    import io

    path = tmp_path / "m.gguf"
    write(path, SMALL)
    stream = io.StringIO()
    model = llama.load(path, progress=True, stream=stream)
    n = len(llama.param_shapes(SMALL))
    assert f"{n}/{n} tensors" in stream.getvalue() and stream.getvalue().endswith("\n")
    assert model.load_seconds > 0


def test_write_f32_copies_keys_and_dequantized_tensors(tmp_path):
    src, dst = tmp_path / "q.gguf", tmp_path / "f32.gguf"
    w = write(src, CFG, types=dict(zip(_matrices(CFG), MATRIX_TYPES, strict=False)))
    llama.write_f32(src, dst)
    r = GGUFReader(dst)
    assert all(t.tensor_type == Q.F32 for t in r.tensors)
    assert [t.name for t in r.tensors] == [t.name for t in GGUFReader(src).tensors]
    assert r.fields["general.file_type"].contents() == 0
    assert r.fields["llama.context_length"].types == [V.UINT32]
    for t in r.tensors:
        np.testing.assert_array_equal(np.asarray(t.data).reshape(w[t.name].shape), w[t.name])
    a, b = (llama.logits(llama.load(p, progress=False), IDS) for p in (src, dst))
    np.testing.assert_array_equal(a, b)


def test_write_f32_of_a_bad_file_writes_nothing(tmp_path):
    src, dst = tmp_path / "bad.gguf", tmp_path / "out.gguf"
    write(src, SMALL, drop=("output_norm.weight",))
    with pytest.raises(ShapeError, match="output_norm.weight"):
        llama.write_f32(src, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_logits_refuses_bad_ids(tmp_path):
    path = tmp_path / "m.gguf"
    write(path, SMALL)
    model = llama.load(path, progress=False)
    for ids, match in (([], "non-empty"), ([1, 256], "outside the vocabulary"),
                       ([[1, 2]], "non-empty sequence"), ([0.5], "token ids")):
        with pytest.raises(InvalidValueError, match=match):
            llama.logits(model, ids)


def test_vocab_size_beyond_the_tokens_is_refused_at_load(tmp_path):
    """Issue 32 row 13: vocab_size 300 with 256 tokens loaded, and ``generate`` failed later
    on token id 299."""
    import dataclasses

    path = tmp_path / "v300.gguf"
    write(path, dataclasses.replace(SMALL, n_vocab=300))
    with pytest.raises(ShapeError, match="holds 256 tokens .* the model 300"):
        llama.load(path, progress=False)
    with pytest.raises(ShapeError, match="holds 256 tokens"):
        llama.load(path, base_type="keep", progress=False)
