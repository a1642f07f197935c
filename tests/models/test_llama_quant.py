"""``llama.load(path, base_type="keep")``: small random quantized llamas keep the file's types
(matrices mapped read-only, no copy; norms F32), compute their products as ggml does (the
activations rounded to 8 bits: logits within the rounding of the dequantized F32 load's, not
equal to them), and refuse what a frozen quantized base cannot do."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

import ggopt
from ggopt._kernels import _ggml_order, _quant_dot
from ggopt.errors import DTypeError, InvalidValueError, StateError
from ggopt.lm import SamplingParams, generate, lora, perplexity
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.models import llama
from ggopt.models.llama.graph import is_read_only
from ggopt.models.llama.mapped import MAPPABLE_TYPES
from ggopt.types import FLAG_PARAM
from tests.support.finetune import windows
from tests.support.llama_files import Q, write

CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                   tied_output=True)
K_CFG = llama.Config(n_ctx=32, n_embd=256, n_layer=1, n_head=4, n_head_kv=2, n_ff=256,
                     tied_output=True)  # K-quant rows are 256-element super-blocks
IDS = np.array([3, 250, 17, 0, 99, 128, 7, 64, 200, 1, 33, 90, 12])
KERNEL_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F32]


def _matrices(cfg: llama.Config) -> list[str]:
    return [n for n, s in llama.param_shapes(cfg).items() if len(s) == 2]


def _file(tmp_path, qtype, embd=Q.Q8_0, cfg=CFG):
    types = {n: qtype for n in _matrices(cfg)}
    types["token_embd.weight"] = embd  # SmolLM2's tied Q8_0 embedding and output
    path = tmp_path / f"{qtype.name}.gguf"
    write(path, cfg, types=types)
    return path


def _assert_q8_rounding(got: np.ndarray, want: np.ndarray, rel: float = 0.05) -> None:
    """``got`` (a kept model's logits) are ``want`` (the F32 load's) moved by the 8-bit
    rounding of the activations (the tied Q8_0 output head's at least): not equal, within
    ``rel`` of their largest magnitude."""
    diff = float(np.abs(got - want).max())
    assert 0 < diff < rel * np.abs(want).max()


@pytest.mark.parametrize("qtype", KERNEL_TYPES)
def test_keep_maps_the_matrices_and_rounds_like_ggml(tmp_path, qtype):
    path = _file(tmp_path, qtype)
    f32 = llama.load(path, progress=False)
    kept = llama.load(path, progress=False, base_type="keep")
    assert kept.base_type == "keep" and f32.base_type == "f32"
    reader = GGUFReader(path)
    for t in reader.tensors:
        w = kept.net.params[t.name]
        if len(t.shape) == 1:
            assert w.type is ggopt.F32 and not is_read_only(w)  # norms: F32 of their own
            continue
        assert int(w.type) == int(t.tensor_type) and is_read_only(w)
        assert w.nbytes() == int(t.n_bytes)  # the file's bytes, no F32 copy
        np.testing.assert_array_equal(w.numpy().reshape(-1), np.asarray(t.data).reshape(-1)
                                      .view(w.numpy().dtype))
    want = llama.logits(f32, IDS)
    got = llama.logits(kept, IDS)
    _assert_q8_rounding(got, want)
    assert not any(t.flags & FLAG_PARAM for t in kept.net.params.values())
    for name, arr in llama.get_weights(kept.net).items():  # dequantized for export
        np.testing.assert_array_equal(arr, llama.get_weights(f32.net)[name])


def test_keep_maps_every_block_type(tmp_path):
    cfg = llama.Config(n_ctx=32, n_embd=256, n_layer=1, n_head=4, n_head_kv=2, n_ff=256)
    names = _matrices(cfg)  # K-quant rows are 256-element blocks
    # (F16 and BF16 are kept too, computing in their own type: tests/models/test_llama_bf16.py)
    types = dict(zip(names, [Q.Q4_K, Q.Q3_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q4_1, Q.Q8_0] * 4,
                     strict=False))
    path = tmp_path / "mixed.gguf"
    write(path, cfg, types=types)
    kept = llama.load(path, progress=False, base_type="keep")
    assert kept.net.ggml_order  # every matrix has a ggml-order product: llama.cpp's bits
    for name, qtype in types.items():
        w = kept.net.params[name]
        assert int(qtype) in {int(t) for t in MAPPABLE_TYPES}
        assert int(w.type) == int(qtype) and is_read_only(w)
    f32 = llama.load(path, progress=False)
    # random K-quant blocks make logits of a few hundred; the 8-bit rounding of the activations
    # moves the largest by 20-40 % (the kernels' exactness: tests/kernels/test_quant_dot.py)
    _assert_q8_rounding(llama.logits(kept, IDS), llama.logits(f32, IDS), rel=0.5)


def test_keep_gives_the_same_logits_on_every_integer_kernel(tmp_path):
    """Kept K-quant, Q4_1 and Q8_0 matrices: the logits' bytes do not depend on the kernel
    (AMX, AVX-512 VNNI, AVX-VNNI, AVX2, portable: those this CPU has)."""
    cfg = llama.Config(n_ctx=32, n_embd=256, n_layer=1, n_head=4, n_head_kv=2, n_ff=256)
    types = dict(zip(_matrices(cfg), [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q4_1, Q.Q8_0],
                     strict=False))
    path = tmp_path / "mixed.gguf"
    write(path, cfg, types=types)
    kept = llama.load(path, progress=False, base_type="keep")
    assert {int(t.type) for t in kept.net.params.values()} >= {int(q) for q in types.values()}
    outs = set()
    try:
        for kernel in _quant_dot.available():
            _quant_dot.set_kernel(kernel)
            outs.add(llama.logits(kept, IDS).tobytes())
    finally:
        _quant_dot.set_kernel("auto")
    assert len(outs) == 1


def test_keep_generates_its_own_greedy_tokens_and_evaluates_near_the_f32_load(tmp_path):
    path = _file(tmp_path, Q.Q4_1)
    f32 = llama.load(path, progress=False)
    kept = llama.load(path, progress=False, base_type="keep")
    greedy = SamplingParams(temp=0)
    ids = list(IDS[:5])
    for _ in range(6):  # one token at a time against the whole prompt each time
        ids.append(int(np.argmax(llama.logits(kept, ids)[-1])))
    assert generate(kept, list(IDS[:5]), 6, greedy).tokens == ids[5:]
    text = list(np.random.default_rng(3).integers(0, 256, 200))
    a, b = perplexity(f32, text, 32), perplexity(kept, text, 32)
    assert b.n_chunks == a.n_chunks and 0 < abs(b.ppl / a.ppl - 1) < 0.01


@pytest.mark.parametrize("order", [True, False], ids=["ggml-order", "ggopt-order"])
def test_kept_logits_are_the_same_bits_for_1_2_and_3_threads(tmp_path, order):
    kept = llama.load(_file(tmp_path, Q.Q4_1), progress=False, base_type="keep",
                      ggml_order=order)
    old = ggopt.get_n_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            ggopt.set_n_threads(n)
            outs.append(llama.logits(kept, IDS))
    finally:
        ggopt.set_n_threads(old)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_kept_models_compute_in_ggml_order_by_default(tmp_path, qtype):
    """``base_type="keep"`` gives llama.cpp's bits (ggml's float order; against llama.cpp
    itself: tests/models/test_smollm_interop.py), the same values as ggopt's order to the
    8-bit rounding, and the same bits on the lane-by-lane kernels as on AVX2."""
    path = _file(tmp_path, qtype, cfg=K_CFG if qtype in (Q.Q4_K, Q.Q6_K) else CFG)
    kept = llama.load(path, progress=False, base_type="keep")
    fast = llama.load(path, progress=False, base_type="keep", ggml_order=False)
    assert kept.net.ggml_order and not fast.net.ggml_order
    assert not llama.load(path, progress=False).net.ggml_order
    got = llama.logits(kept, IDS)
    np.testing.assert_allclose(got, llama.logits(fast, IDS), atol=0.05 * np.abs(got).max())
    _ggml_order.force_portable(True)
    try:
        assert np.array_equal(llama.logits(kept, IDS), got)
    finally:
        _ggml_order.force_portable(False)


def test_training_graphs_keep_ggopt_s_order(tmp_path):
    """A LoRA fine-tune of a kept model trains in ggopt's order (faster products; the
    gradients need no llama.cpp bits): no node of its graph is set to ggml's."""
    kept = llama.load(_file(tmp_path, Q.Q4_1), progress=False, base_type="keep")
    lora.attach(kept.net, lora.create(kept.net, 2, 4.0))
    tuner = FineTuner(kept.net, windows(8, 32, 256), FinetuneParams())
    out = tuner._logits(ggopt.Context())
    ordered = llama.build_logits(ggopt.Context(), kept.net, tuner.inp)
    graph = ggopt.new_graph_custom(ggopt.Context(), 8192, False)
    ggopt.build_forward_expand(graph, out)
    assert not any(getattr(n.op_params, "ggml_order", False) for n in graph.nodes)
    assert getattr(ordered.op_params, "ggml_order", False)  # the tied Q8_0 output product


def test_a_kept_weight_is_frozen(tmp_path):
    kept = llama.load(_file(tmp_path, Q.Q4_1), progress=False, base_type="keep")
    with pytest.raises(DTypeError, match="quantized"):
        ggopt.set_param(kept.net.params["blk.0.attn_q.weight"])
    with pytest.raises(StateError, match="base_type='f32'"):
        llama.set_weights(kept.net, llama.get_weights(kept.net), "test")


def test_full_fine_tune_of_a_kept_model_is_refused(tmp_path):
    kept = llama.load(_file(tmp_path, Q.Q4_1), progress=False, base_type="keep")
    with pytest.raises(StateError, match="quantized tensor never trains.*base_type='f32'"):
        FineTuner(kept.net, windows(8, 32, 256), FinetuneParams())
    f32_matrices = llama.load(_file(tmp_path, Q.F32, embd=Q.F32), progress=False,
                              base_type="keep")
    with pytest.raises(StateError, match="nothing would train"):
        FineTuner(f32_matrices.net, windows(8, 32, 256), FinetuneParams())


def test_unknown_base_type_is_refused(tmp_path):
    with pytest.raises(InvalidValueError, match="base_type must be one of f32, keep"):
        llama.load(_file(tmp_path, Q.Q4_1), progress=False, base_type="q4")


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_a_non_finite_block_scale_is_refused(tmp_path, qtype):
    path = _file(tmp_path, qtype)
    t = next(t for t in GGUFReader(path).tensors if t.name == "blk.1.ffn_up.weight")
    raw = bytearray(path.read_bytes())
    inf16 = np.float16(np.inf).tobytes()
    at = int(t.data_offset) + 5 * (20 if qtype == Q.Q4_1 else 34)  # the sixth block's scale
    raw[at:at + 2] = inf16
    path.write_bytes(bytes(raw))
    with pytest.raises(InvalidValueError, match="blk.1.ffn_up.weight.*NaN or infinite scale"):
        llama.load(path, progress=False, base_type="keep")


def test_cli_generate_and_eval_with_base_type_keep(tmp_path, capsys):
    from ggopt.cli import llm

    path = str(_file(tmp_path, Q.Q4_1))
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(32, 127)) * 4)
    outs = {}
    for base_type in ("f32", "keep"):
        assert llm.main(["generate", "--model", path, "--prompt", "abc", "-n", "8", "--temp",
                         "0", "--base-type", base_type]) == 0
        gen = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("main:")]
        assert llm.main(["eval", "--model", path, "--text", str(text), "--ctx", "32",
                         "--base-type", base_type]) == 0
        ppl = [x.split()[:2] for x in capsys.readouterr().out.splitlines()
               if x.startswith("perplexity")]
        outs[base_type] = (gen, ppl)
    assert outs["keep"][0] and outs["keep"][1] and len(outs["keep"][1]) == len(outs["f32"][1])
    for (name, keep), (_, f32) in zip(outs["keep"][1], outs["f32"][1], strict=True):
        assert name == "perplexity:" and 0 < abs(float(keep) / float(f32) - 1) < 0.01


def test_a_file_of_the_other_byte_order_is_not_mapped(tmp_path):
    path = tmp_path / "big.gguf"
    write(path, CFG, types={n: Q.Q8_0 for n in _matrices(CFG)}, big_endian=True)
    with pytest.raises(DTypeError, match="byte order.*base_type='f32'"):
        llama.load(path, progress=False, base_type="keep")


def test_f32_weights_take_ggml_s_order_when_asked(tmp_path):
    """An F32 load asked for ggml's order (``ggml_order=True``): its weight products are
    flagged too (llama.cpp's bits on the F32 copy: tests/models/test_smollm_interop.py), the
    logits are ggopt's order's to float rounding, and the lane-by-lane kernels give the same
    bits."""
    path = _file(tmp_path, Q.Q4_1)
    f32 = llama.load(path, progress=False)
    ordered = llama.load(path, progress=False, ggml_order=True)
    assert not f32.net.ggml_order and ordered.net.ggml_order
    weights = {id(t) for t in ordered.net.params.values() if t.ne[1] > 1}
    graph = ggopt.new_graph_custom(ggopt.Context(), 8192, False)
    inp = llama.make_inputs(ordered.net, 1, len(IDS))
    ggopt.build_forward_expand(graph, llama.build_logits(ggopt.Context(), ordered.net, inp))
    products = [n for n in graph.nodes if n.op.name == "MUL_MAT" and id(n.src[0]) in weights]
    assert len(products) == 7 * CFG.n_layer + 1  # the blocks' seven and the (tied) output
    assert all(getattr(n.op_params, "ggml_order", False) for n in products)
    got = llama.logits(ordered, IDS)
    np.testing.assert_allclose(got, llama.logits(f32, IDS), rtol=0, atol=1e-4)
    _ggml_order.force_portable(True)
    try:
        assert np.array_equal(llama.logits(ordered, IDS).view(np.int32), got.view(np.int32))
    finally:
        _ggml_order.force_portable(False)
