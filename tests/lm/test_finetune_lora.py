"""LoRA: B = 0 is the base exactly, its gradients by the chain rule from the full
gradient, the frozen base has no accumulators or moments, llama.cpp's adapter file."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from ggopt import backend as gb
from ggopt.backend.profile import NodeTimes
from ggopt.errors import GgoptError, InvalidValueError, StateError
from ggopt.lm import lora
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.models import llama
from ggopt.tensor import Op
from tests.support.finetune import CFG, loss_and_grads, tiny, windows
from tests.support.finetune import logits as _logits


def test_b_zero_is_the_base_exactly():
    net = tiny()
    tokens = windows(1).tokens[0]
    base = _logits(net, tokens)
    lora.attach(net, lora.create(net, 4, 8.0))
    assert np.array_equal(base, _logits(net, tokens))


def test_gradients_follow_the_chain_rule():
    """dL/dA = s B^T G and dL/dB = s G A^T, G the full gradient at W + s B A."""
    net = tiny()
    ad = lora.create(net, 3, 6.0, ("attn_q", "ffn_down"), seed=2)
    rng = np.random.default_rng(4)
    for t in ad.b.values():  # B != 0, so that dA is not zero either
        gb.tensor_set(t, (rng.standard_normal((t.ne[1], t.ne[0])) * 0.3).astype(np.float32))
    lora.attach(net, ad)
    w = windows(1)
    _, g_lora = loss_and_grads(net, w.tokens, w.labels)
    assert sorted(g_lora) == sorted([n + ".lora_a" for n in ad.a] + [n + ".lora_b" for n in ad.b])
    full = tiny()
    llama.set_weights(full, lora.merged(llama.get_weights(full), ad), "merged")
    _, g_full = loss_and_grads(full, w.tokens, w.labels)
    for name, (a, b) in ad.arrays().items():
        s, G = ad.scale(name), g_full[name].astype(np.float64)
        np.testing.assert_allclose(g_lora[name + ".lora_a"], s * b.T @ G, rtol=2e-3, atol=1e-6)
        np.testing.assert_allclose(g_lora[name + ".lora_b"], s * G @ a.T, rtol=2e-3, atol=1e-6)


def test_frozen_base_has_no_accumulators_or_moments():
    net = tiny()
    ad = lora.create(net, 2, 4.0)
    lora.attach(net, ad)
    # dynamic graphs: every PARAM gets an accumulator there (static ones with one micro-batch
    # per step need none, as in ggml-opt)
    ft = FineTuner(net, windows(6), FinetuneParams(val_split=0.2, lr=1e-2, static=False))
    before = llama.get_weights(net)
    ft.train_epoch()
    for t in net.params.values():
        assert ft.opt_ctx.grad_acc(t) is None
    for t in (*ad.a.values(), *ad.b.values()):
        assert ft.opt_ctx.grad_acc(t) is not None
    ft.close()
    after = llama.get_weights(net)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert any(np.abs(b).max() > 0 for _, b in ad.arrays().values())  # B trained


def test_adapter_file_as_llama_cpp_reads_it(tmp_path):
    net = tiny()
    ad = lora.create(net, 4, 8.0, ("attn_q", "attn_v"))
    path = tmp_path / "adapter.gguf"
    lora.save(path, ad)
    r = GGUFReader(path)
    assert r.fields["general.type"].contents() == "adapter"
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["adapter.type"].contents() == "lora"
    assert list(r.fields["adapter.lora.alpha"].types) == [GGUFValueType.FLOAT32]
    shapes = {t.name: [int(d) for d in t.shape] for t in r.tensors}
    assert len(shapes) == 2 * 2 * CFG.n_layer
    C, Ckv = CFG.n_embd, CFG.n_embd_kv
    assert shapes["blk.1.attn_q.weight.lora_a"] == [C, 4]
    assert shapes["blk.1.attn_v.weight.lora_b"] == [4, Ckv]
    assert {int(t.tensor_type) for t in r.tensors} == {int(GGMLQuantizationType.F32)}
    back = lora.load(path, tiny())
    for name, (a, b) in ad.arrays().items():
        a2, b2 = back.arrays()[name]
        assert np.array_equal(a, a2) and np.array_equal(b, b2)
    assert back.alpha == ad.alpha and back.scale("blk.0.attn_q.weight") == 2.0


def _write_adapter(path, alpha_type=GGUFValueType.FLOAT32, tensors=None):
    w = GGUFWriter(path, "llama")
    w.add_key_value("general.type", "adapter", GGUFValueType.STRING)
    w.add_key_value("adapter.type", "lora", GGUFValueType.STRING)
    w.add_key_value("adapter.lora.alpha", 8 if alpha_type != GGUFValueType.FLOAT32 else 8.0,
                    alpha_type)
    for name, arr in (tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("case", ["alpha_int", "unknown", "half", "shape"])
def test_bad_adapters_are_refused(tmp_path, case):
    C = CFG.n_embd
    a, b = np.zeros((2, C), np.float32), np.zeros((C, 2), np.float32)
    tensors = {"blk.0.attn_q.weight.lora_a": a, "blk.0.attn_q.weight.lora_b": b}
    alpha = GGUFValueType.FLOAT32
    if case == "alpha_int":
        alpha = GGUFValueType.UINT32
    elif case == "unknown":
        tensors["blk.9.attn_q.weight.lora_a"] = a
    elif case == "half":
        del tensors["blk.0.attn_q.weight.lora_b"]
    else:
        tensors["blk.0.attn_q.weight.lora_b"] = np.zeros((C + 1, 2), np.float32)
    path = tmp_path / "bad.gguf"
    _write_adapter(path, alpha, tensors)
    with pytest.raises(GgoptError):
        lora.load(path, tiny())


def test_bad_lora_options():
    net = tiny()
    with pytest.raises(InvalidValueError, match="targets"):
        lora.parse_targets("attn_q,token_embd")
    with pytest.raises(InvalidValueError, match="rank"):
        lora.create(net, 0, 8.0)
    with pytest.raises(InvalidValueError, match="exceeds"):
        lora.create(net, CFG.n_embd + 1, 8.0)


def _training_steps(net):
    """The compiled steps of one training micro-batch (NodeTimes: the nodes of each)."""
    ft = FineTuner(net, windows(4), FinetuneParams(val_split=0.0))
    with NodeTimes() as rec:
        ft.microbatch(0, True, 1.0)
    ft.close()
    return rec.steps


def test_adapters_add_no_full_width_pass():
    """The slow LoRA step: the scale applies to the r-row A x, and W x + B (s A x)
    is summed inside the B product's step; full-width scales and adds only as many as the
    full fine-tune has."""
    full_steps = _training_steps(tiny())
    net = tiny()
    ad = lora.create(net, 2, 8.0)
    lora.attach(net, ad)
    steps = _training_steps(net)
    n_in = {t: t.ne[0] for t in ad.a.values()}

    def full_width(steps, op):
        return sum(1 for st in steps for n in st.nodes if n.op is op and n.ne[0] != 2)

    assert full_width(steps, Op.SCALE) == full_width(full_steps, Op.SCALE)
    assert all(n.ne[0] == 2 for st in steps for n in st.nodes
               if n.op is Op.SCALE and n.src[0].op is Op.MUL_MAT and n.src[0].src[0] in n_in)
    b = set(ad.b.values())
    fused_sums = [st for st in steps if len(st.nodes) == 2 and st.nodes[0].op is Op.MUL_MAT
                  and st.nodes[0].src[0] in b and st.nodes[1].op is Op.ADD]
    assert len(fused_sums) == len(b)
    unfused_adds = sum(1 for st in steps if [n.op for n in st.nodes] == [Op.ADD])
    assert unfused_adds <= sum(1 for st in full_steps if [n.op for n in st.nodes] == [Op.ADD]) \
        + len(b)


def _train_lora(threads: int, static: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import ggopt

    prev = ggopt.get_n_threads()
    ggopt.set_n_threads(threads)
    try:
        net = tiny()
        ad = lora.create(net, 8, 16.0, seed=3)
        lora.attach(net, ad)
        ft = FineTuner(net, windows(9), FinetuneParams(n_batch=2, n_ubatch=1, lr=1e-2,
                                                       val_split=0.1, static=static))
        ft.train_epoch()
        ft.close()
        return ad.arrays()
    finally:
        ggopt.set_n_threads(prev)


def test_lora_bits_independent_of_threads_and_static():
    """The adapter's products (one piece below the split size, or fused sums) give the same
    bits on 1, 2 and 3 threads, dynamic or static graphs."""
    ref = _train_lora(2, False)
    assert any(np.any(b != 0) for _, b in ref.values())  # it trained
    for threads, static in ((1, False), (3, False), (2, True)):
        got = _train_lora(threads, static)
        assert all(np.array_equal(ref[k][i], got[k][i]) for k in ref for i in (0, 1))


def _nonzero_adapter(net):
    ad = lora.create(net, 2, 8.0, ["attn_q", "ffn_up"], seed=3)
    for b in ad.b.values():
        gb.tensor_set(b, np.full(b.nelements(), 0.05, np.float32))
    return ad


def test_generator_made_before_attach_applies_the_adapter():
    """A Generator built before lora.attach kept its graphs and ignored the adapter."""
    from ggopt.lm import Generator

    net = tiny()
    gen = Generator(net, 8)
    ad = _nonzero_adapter(net)
    lora.attach(net, ad)
    got = gen.feed([1, 2, 3])
    fresh = Generator(net, 8).feed([1, 2, 3])
    np.testing.assert_array_equal(got, fresh)
    lora.attach(net, lora.create(net, 2, 8.0, ["attn_v"]))  # another change, tokens fed
    with pytest.raises(StateError, match="call reset"):
        gen.feed([4])
    gen.reset()  # a new sequence on the new adapter's graphs
    np.testing.assert_array_equal(gen.feed([1, 2, 3]), Generator(net, 8).feed([1, 2, 3]))


def test_static_tuner_made_before_attach_is_refused():
    """A static FineTuner built before lora.attach trained the base's old graphs silently."""
    net = tiny()
    ft = FineTuner(net, windows(4), FinetuneParams(val_split=0.0, static=True))
    try:
        lora.attach(net, _nonzero_adapter(net))
        with pytest.raises(StateError, match="after attaching"):
            ft.microbatch(0, True, 1.0)
    finally:
        ft.close()
