"""Packed chat windows (issue 32): several conversations per window, each attending only to
itself (a block-diagonal causal mask, rope positions from 0 per conversation). The gradient of
a packed window is the sum of its conversations' gradients computed apart (llama; qwen3 and
gemma3, across gemma3's sliding window), the padding gets exactly zero gradient, first-fit
places the conversations in data order, and windows of one conversation each train to the
bits of the padded windows."""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest

import ggopt.tokenizers as tk
from ggopt.errors import InvalidValueError, ShapeError
from ggopt.lm.chat import chat_windows, first_fit
from ggopt.lm.finetune import FinetuneParams, FineTuner
from ggopt.lm.windows import MASKED, Windows
from ggopt.models import llama, load
from tests.support.families import write_family
from tests.support.finetune import CFG, loss_and_grads, tiny
from tests.support.tokenizer_files import BYTE_TOKENS

LENGTHS = (13, 20, 15)  # positions of three conversations; 16 of padding at ctx 64
T = 64


def _net(tmp_path, arch: str) -> llama.LlamaModel:
    if arch == "llama":
        return tiny(dataclasses.replace(CFG, n_ctx=T))
    path = tmp_path / f"{arch}.gguf"
    write_family(path, arch)
    return load(path, progress=False).net


def _conversations(n_vocab: int, seed: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, labels) of each of :data:`LENGTHS`, the first third of the labels masked (a
    prompt) and every label a token id."""
    rng = np.random.default_rng(seed)
    out = []
    for n in LENGTHS:
        tokens = rng.integers(0, n_vocab, n).astype(np.int32)
        labels = rng.integers(0, n_vocab, n).astype(np.int32)
        labels[:n // 3] = MASKED
        out.append((tokens, labels))
    return out


def _packed(convs, pad: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = np.full((1, T), pad, np.int32)
    labels = np.full((1, T), MASKED, np.int32)
    segments = np.full((1, T), -1, np.int32)
    at = 0
    for i, (t, lab) in enumerate(convs):
        tokens[0, at:at + len(t)], labels[0, at:at + len(t)] = t, lab
        segments[0, at:at + len(t)] = i
        at += len(t)
    return tokens, labels, segments


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_a_packed_windows_gradient_is_the_sum_of_its_conversations(tmp_path, arch):
    # the loss weights make each loss the sum of the cross-entropies over the trained tokens
    net = _net(tmp_path, arch)
    convs = _conversations(net.cfg.n_vocab)
    tokens, labels, segments = _packed(convs)
    loss, grads = loss_and_grads(net, tokens, labels, weight=T, segments=segments)
    apart = [loss_and_grads(net, t[None], lab[None], weight=len(t)) for t, lab in convs]
    assert loss == pytest.approx(sum(a[0] for a in apart), rel=1e-5)
    assert grads.keys() == apart[0][1].keys() and len(grads) >= len(llama.param_shapes(net.cfg)) - 1
    for name, g in grads.items():
        total = sum(a[1][name] for a in apart)
        scale = float(np.abs(total).max())
        assert scale > 0, name
        np.testing.assert_allclose(g, total, rtol=0, atol=2e-5 * scale, err_msg=name)
    # the check has teeth: one causal mask over the whole window mixes the conversations
    _, mixed = loss_and_grads(net, tokens, labels, weight=T)
    worst = max(float(np.abs(mixed[k] - sum(a[1][k] for a in apart)).max() /
                      np.abs(sum(a[1][k] for a in apart)).max()) for k in grads)
    assert worst > 1e-2


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_padding_gets_exactly_zero_gradient(tmp_path, arch):
    # other padding tokens leave the loss and every gradient bit-identical
    net = _net(tmp_path, arch)
    convs = _conversations(net.cfg.n_vocab)
    a = _packed(convs, pad=0)
    b = _packed(convs, pad=5)
    b[0][0, -16:] = np.arange(16) % net.cfg.n_vocab
    la, ga = loss_and_grads(net, a[0], a[1], weight=T, segments=a[2])
    lb, gb_ = loss_and_grads(net, b[0], b[1], weight=T, segments=b[2])
    assert la == lb and all(np.array_equal(ga[k], gb_[k]) for k in ga)


def test_set_segments_positions_and_masks():
    net = tiny(dataclasses.replace(CFG, n_ctx=8))
    inp = llama.make_inputs(net, 2, 6, packed=True)
    seg = np.array([[0, 0, 0, 1, 1, -1], [0, 1, 1, 1, 2, 2]], np.int32)
    llama.set_segments(inp, net.cfg, seg)
    from ggopt.backend import tensor_get
    pos = tensor_get(inp.pos).reshape(2, 6)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 0, 1]]
    mask = tensor_get(inp.mask).reshape(2, 6, 6) == 0  # [window, query, key]: visible
    assert mask[0, 4].tolist() == [False, False, False, True, True, False]
    assert mask[0, 5].tolist() == [False] * 5 + [True]  # the padding sees itself alone
    assert mask[1, 3].tolist() == [False, True, True, True, False, False]
    with pytest.raises(ShapeError, match="segments of shape"):
        llama.set_segments(inp, net.cfg, seg[:1])
    with pytest.raises(ShapeError, match="not packed"):
        llama.set_segments(llama.make_inputs(net, 2, 6), net.cfg, seg)


def test_first_fit_in_data_order():
    assert first_fit([5, 8, 3, 6, 2], 10) == [(0, 0), (1, 0), (0, 5), (2, 0), (0, 8)]
    assert first_fit([], 10) == []


CHATML = ("{% for m in messages %}{{ '<s>' + m['role'] + '\n' + m['content'] + '</s>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}")


@functools.cache
def _tok() -> tk.Tokenizer:
    """ggopt's byte vocabulary with a ChatML-like template, loaded from a GGUF file."""
    path = Path(tempfile.mkdtemp()) / "byte-chat.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", "rwkv")
    w.add_array("tokenizer.ggml.tokens", BYTE_TOKENS)
    w.add_string("tokenizer.chat_template", CHATML)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return tk.load(path)


def _conv(q: str, a: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


CONVS = [_conv("hi", "hello there"), _conv("What is two and two?", "4"), _conv("ok?", "yes"),
         _conv("A longer question about licences and copying", "Everyone may copy it."),
         _conv("x", "y")]


def test_packed_chat_windows_hold_each_conversation_as_the_padded_ones_do():
    tok = _tok()
    padded = chat_windows(tok, CONVS, 96)
    packed = chat_windows(tok, CONVS, 96, pack=True)
    sizes = [int(n) for n in padded.lengths]
    places = first_fit(sizes, 96)
    assert len(packed) == max(w for w, _ in places) + 1 < len(padded)
    assert packed.packed and not padded.packed
    for i, (w, at) in enumerate(places):
        n = sizes[i]
        np.testing.assert_array_equal(packed.tokens[w, at:at + n], padded.tokens[i, :n])
        np.testing.assert_array_equal(packed.labels[w, at:at + n], padded.labels[i, :n])
        seg = packed.segments[w, at:at + n]
        assert len(set(seg.tolist())) == 1 and seg[0] == len(set(packed.segments[w, :at]) - {-1})
    assert packed.n_trained() == padded.n_trained()
    assert packed.real_tokens() == padded.real_tokens() == sum(sizes)
    assert np.array_equal(packed.segments < 0, packed.tokens * 0 + np.arange(96) >=
                          packed.lengths[:, None])  # the padding is each window's tail
    assert padded.real_tokens() < len(padded) * 96 == padded.tokens.size


@pytest.mark.parametrize("overflow", ["truncate", "skip"])
def test_a_long_conversation_follows_the_overflow_rule_when_packed(overflow):
    tok = _tok()
    convs = [*CONVS[:2], _conv("q" * 80, "a" * 40), *CONVS[2:]]
    padded = chat_windows(tok, convs, 64, overflow)
    packed = chat_windows(tok, convs, 64, overflow, pack=True)
    assert packed.overflow == padded.overflow and packed.overflow.line(64)
    assert packed.n_trained() == padded.n_trained()
    if overflow == "truncate":  # each truncated one fills a window of its own
        full = [w for w in range(len(packed)) if packed.lengths[w] == 64]
        assert len(full) == packed.overflow.truncated >= 1
        assert all(set(packed.segments[w].tolist()) == {0} for w in full)
    with pytest.raises(ShapeError, match="raise --ctx"):
        chat_windows(tok, convs, 64, "error", pack=True)


def _windows(pack: bool) -> Windows:
    """Six conversations of 9 to 14 positions at ctx 16: one per window, packed or not."""
    rng = np.random.default_rng(4)
    tokens = np.zeros((6, 16), np.int32)
    labels = np.full((6, 16), MASKED, np.int32)
    segments = np.full((6, 16), -1, np.int32)
    lengths = rng.integers(9, 15, 6)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(0, 64, n)
        labels[i, 3:n] = rng.integers(0, 64, n - 3)
        segments[i, :n] = 0
    return Windows(tokens, labels, segments=segments if pack else None, lengths=lengths)


@pytest.mark.parametrize(("ubatch", "static"), [(1, True), (2, True), (1, False)])
def test_one_conversation_per_window_trains_to_the_bits_of_the_padded_windows(ubatch, static):
    # micro-batches of 2: one mask per window in the batch ([T, T, 1, 2]); dynamic graphs
    weights = []
    for pack in (False, True):
        net = tiny()
        ft = FineTuner(net, _windows(pack), FinetuneParams(n_batch=2, n_ubatch=ubatch,
                                                           lr=1e-3, val_split=0.0,
                                                           static=static))
        for _ in range(2):
            ft.train_epoch()
        assert ft.real_tokens == 2 * int(_windows(pack).lengths.sum()) < ft.train_tokens
        ft.close()
        weights.append(llama.get_weights(net))
    assert not all(np.array_equal(weights[0][k], v) for k, v in
                   llama.get_weights(tiny()).items())  # it trained
    assert all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_session_packs_chat_data_only(tmp_path):
    import json

    from ggopt.lm import FineTune
    from tests.support.llama_files import V, write

    model, chat = tmp_path / "m.gguf", tmp_path / "c.jsonl"
    write(model, dataclasses.replace(CFG, n_ctx=96, n_vocab=256),
          key_overrides={"tokenizer.chat_template": (CHATML, V.STRING)})
    chat.write_text("\n".join(json.dumps({"messages": c}) for c in CONVS * 4))
    session = FineTune(model, 4, progress=False)
    w = session.data(chat=chat, ctx=96, pack=True)
    assert w.packed and len(w) < len(CONVS) * 4
    history = session.fit(1, batch=1, val_split=0.2)
    assert np.isfinite(history.train_loss).all() and session.val_before > 0
    ft = FineTune.__new__(FineTune)  # data() is checked before the model is used
    with pytest.raises(InvalidValueError, match="needs a chat file"):
        ft.data(text=tmp_path / "a.txt", pack=True)
    with pytest.raises(InvalidValueError, match="True or False"):
        ft.data(chat=tmp_path / "a.jsonl", pack="yes")
