"""BF16 llamas: F16 and BF16 GGUFs kept as shipped (``base_type="keep"``, mapped), and
``compute_type="bf16"`` (the matrices stored in BF16 at load, every weight product in BF16 with
F32 sums; per graph rounding of F32 weights), on tiny byte-vocabulary llamas."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt.cli.llm import main as llm_main
from ggopt.errors import InvalidValueError, StateError
from ggopt.lm import SamplingParams, generate
from ggopt.lowp import round_to
from ggopt.models import llama
from ggopt.models.llama.graph import is_read_only
from ggopt.models.llama.mapped import base_bytes, check_trainable
from ggopt.types import BF16, F16, F32
from tests.support.llama_files import Q, write
from tests.support.llm_ref import random_weights

CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                   tied_output=True)
IDS = [3, 71, 200, 15, 15, 99, 4, 250, 31, 8, 120, 66]


def _matrices(qtype):
    return {n: qtype for n, s in llama.param_shapes(CFG).items() if len(s) == 2}


@pytest.fixture
def files(tmp_path):
    """The same weights as an F32 file, a BF16 file and an F16 file."""
    paths = {}
    for name, q in (("f32", None), ("bf16", Q.BF16), ("f16", Q.F16)):
        paths[name] = tmp_path / f"{name}.gguf"
        write(paths[name], CFG, types=_matrices(q) if q else None, seed=3)
    return paths


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def test_bf16_and_f16_files_load_kept_mapped_without_a_copy(files):
    for kind, t in (("bf16", BF16), ("f16", F16)):
        m = llama.load(files[kind], base_type="keep", progress=False)
        mats = {n: p for n, p in m.net.params.items() if p.ne[1] > 1}
        assert {p.type for p in mats.values()} == {t}
        assert all(is_read_only(p) for p in mats.values())
        held, as_f32, mapped = base_bytes(m.net)
        assert mapped == sum(p.nbytes() for p in mats.values()) and held < 0.55 * as_f32
        assert not any(p.is_param for p in m.net.params.values())


def test_a_kept_bf16_file_computes_as_the_f32_file_loaded_in_bf16(files):
    """The BF16 file holds the F32 file's weights rounded as ggml rounds them, so the two
    models have the same BF16 weights and give the same bits."""
    kept = llama.logits(llama.load(files["bf16"], base_type="keep", progress=False), IDS)
    conv = llama.load(files["f32"], compute_type="bf16", progress=False)
    assert {p.type for p in conv.net.params.values() if p.ne[1] > 1} == {BF16}
    np.testing.assert_array_equal(_bits(kept), _bits(llama.logits(conv, IDS)))
    ref = llama.logits(llama.load(files["f32"], progress=False), IDS)
    err = np.abs(kept - ref).max()
    assert 0 < err < 0.05 * np.abs(ref).max()  # BF16's 8-bit mantissa: close, not equal


def test_f16_file_kept_rounds_activations_to_f16(files):
    kept = llama.logits(llama.load(files["f16"], base_type="keep", progress=False), IDS)
    f32 = llama.logits(llama.load(files["f16"], progress=False), IDS)  # F16 values in F32
    assert 0 < np.abs(kept - f32).max() < 0.01 * np.abs(f32).max()


def test_a_kept_bf16_file_generates_and_evaluates(files, capsys):
    m = llama.load(files["bf16"], base_type="keep", progress=False)
    r = generate(m, IDS[:4], 6, SamplingParams(temp=0.0))
    assert len(r.tokens) == 6 and all(0 <= t < CFG.n_vocab for t in r.tokens)
    # greedy: each token is the argmax of the logits of the sequence so far (no cache)
    seq = list(IDS[:4])
    for t in r.tokens[:3]:
        assert t == int(np.argmax(llama.logits(m, seq)[-1]))
        seq.append(t)
    rc = llm_main(["generate", "--model", str(files["bf16"]), "--base-type", "keep", "-n", "4",
                   "--prompt", "GNU", "--temp", "0"])
    assert rc == 0 and "generated 4 tokens" in capsys.readouterr().out


def test_graph_rounding_of_f32_weights_equals_bf16_storage(tmp_path):
    """compute_type='bf16' on F32 weights: one cpy F32 -> BF16 per weight in the graph, the
    same products (and bits) as the weights stored in BF16 at load. (The embedding lookup
    reads the F32 master: the file's values are BF16's, so that both look up the same.)"""
    path = tmp_path / "exact.gguf"
    w = {n: round_to(BF16, a) for n, a in random_weights(llama.param_shapes(CFG), 4).items()}
    write(path, CFG, weights=w)
    f32 = llama.load(path, progress=False)
    f32.net.compute_type = "bf16"
    stored = llama.load(path, compute_type="bf16", progress=False)
    np.testing.assert_array_equal(_bits(llama.logits(f32, IDS)),
                                  _bits(llama.logits(stored, IDS)))
    ctx = ggopt.Context()
    logits = llama.build_logits(ctx, f32.net, llama.make_inputs(f32.net, 1, 4))
    gf = ggopt.new_graph_custom(ctx, 4096, False)
    ggopt.build_forward_expand(gf, logits)
    copies = [n for n in gf.nodes if n.op is ggopt.Op.CPY and n.type is BF16]
    assert len(copies) == 7 * CFG.n_layer + 1  # the projections and the tied output head
    default = ggopt.Context()
    f32.net.compute_type = "f32"
    gd = ggopt.new_graph_custom(default, 4096, False)
    ggopt.build_forward_expand(gd, llama.build_logits(default, f32.net,
                                                      llama.make_inputs(f32.net, 1, 4)))
    assert not any(n.type is BF16 for n in gd.nodes)


def test_bf16_storage_rounds_as_ggml_and_is_frozen(files):
    m = llama.load(files["f32"], compute_type="bf16", progress=False)
    ref = llama.load(files["f32"], progress=False)
    w = llama.get_weights(m.net)
    r = llama.get_weights(ref.net)
    name = "blk.1.ffn_up.weight"
    np.testing.assert_array_equal(w[name], round_to(BF16, r[name]))
    assert m.net.params["output_norm.weight"].type is F32
    np.testing.assert_array_equal(w["output_norm.weight"], r["output_norm.weight"])
    assert m.compute_type == "bf16" and m.net.compute_type == "bf16"
    with pytest.raises(StateError, match="FinetuneParams"):
        check_trainable(m.net, "finetune")
    with pytest.raises(StateError):
        llama.set_weights(m.net, r, "test")


def test_unknown_compute_type_is_refused(files):
    with pytest.raises(InvalidValueError, match="compute_type"):
        llama.load(files["f32"], compute_type="f16", progress=False)
    m = llama.load(files["f32"], progress=False)
    with pytest.raises(InvalidValueError, match="compute_type"):
        llama.build_logits(ggopt.Context(), m.net, llama.make_inputs(m.net, 1, 4),
                           compute_type="bfloat16")


def test_bf16_logits_do_not_depend_on_the_thread_count(files):
    m = llama.load(files["f32"], compute_type="bf16", progress=False)
    got = []
    for n in (1, 2, 3):
        ggopt.set_n_threads(n)
        got.append(_bits(llama.logits(m, IDS)))
    ggopt.set_n_threads(None)
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])
