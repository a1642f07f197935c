"""ggopt.tokenizers: the byte vocabulary of ggopt's models, SmolLM2's BPE, Llama's SPM,
special tokens, BOS/EOS, end-of-generation ids and the refusals of malformed vocabularies."""

from __future__ import annotations

import functools

import gguf
import pytest

import ggopt.tokenizers as tk
from ggopt.errors import DTypeError, GgoptError, InvalidValueError, ShapeError
from tests.support.tokenizer_files import (
    BYTE_TOKENS,
    smollm2_path,
    tiny_bpe,
    vocab_path,
    write_vocab,
)

load = functools.cache(tk.load)
# -- ggopt's own byte vocabulary -------------------------------------------------------------
def test_byte_vocab_of_ggopt_models(tmp_path):
    path = write_vocab(tmp_path / "llm.gguf", model="rwkv", tokens=BYTE_TOKENS,
                       token_type=([1] * 256, gguf.GGUFValueType.INT32))
    tok = tk.load(path)
    data = bytes(range(256)) + b"\xff\x00 caf\xc3\xa9"
    assert tok.encode(data) == list(data)
    assert tok.decode(list(data)) == data
    assert tok.n_vocab == 256 and tok.bos is None and tok.eos is None and not tok.eog
    assert tok.encode("é") == [0xC3, 0xA9]


def test_from_gguf_takes_an_open_reader(tmp_path):
    path = tiny_bpe(tmp_path)
    reader = gguf.GGUFReader(path)
    for source in (reader, reader.fields):
        tok = tk.from_gguf(source)
        assert tok.encode("abc ab", add_special=False) == tk.load(path).encode(
            "abc ab", add_special=False) == [4, 5, 3]  # "a b" ranks before "Ġ a"


# -- BPE ---------------------------------------------------------------------------------------
def test_bpe_merges_by_rank_and_falls_back_to_bytes(tmp_path):
    tok = tk.load(tiny_bpe(tmp_path))
    assert tok.encode("abc", add_special=False) == [4]
    assert tok.encode("ab a", add_special=False) == [3, 6]
    assert tok.encode("ba", add_special=False) == [1, 0]
    # 'd' is no token and its byte is not either: llama.cpp drops it
    assert tok.encode("dab", add_special=False) == [3]
    assert tok.decode([4, 6]) == b"abc a"


def test_special_tokens_parse_only_when_asked(tmp_path):
    tok = tk.load(tiny_bpe(tmp_path))
    assert tok.encode("a<s>b", add_special=False, parse_special=True) == [0, 7, 1]
    assert 7 not in tok.encode("a<s>b", add_special=False)
    assert tok.decode([7]) == b"<s>" and tok.decode([7], special=False) == b""


@pytest.mark.model
def test_smollm2_exact_ids():
    tok = load(smollm2_path())
    assert (tok.model, tok.pre, tok.n_vocab, tok.bos, tok.eos) == ("gpt2", "smollm", 49152, 1, 2)
    assert not tok.add_bos and not tok.add_eos
    # the ids of llama.cpp's smollm pre-tokenizer: every digit alone, then GPT-2's regex
    # (derived with Hugging Face's `tokenizers` package)
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.encode(" Hello World!\n\n12345 apples") == [38699, 2260, 17, 1116, 33, 34, 35,
                                                            36, 37, 13855]
    assert tok.encode("  \t\n\n2 x\n\n3") == [256, 197, 1116, 34, 1792, 1116, 35]
    assert tok.encode("I'm can't we'LL") == [57, 5248, 416, 982, 392, 23, 16421]
    assert tok.encode("café naïve 日本語 😀") == [83, 1939, 2756, 15486, 46494, 17097, 241, 115,
                                                 40993, 179, 120, 248, 40303, 218]
    chat = "<|im_start|>user\nHi<|im_end|>\n"
    assert tok.encode(chat, parse_special=True) == [1, 4093, 198, 26843, 2, 198]
    assert tok.encode(chat)[:8] == [44, 108, 306, 79, 3738, 108, 46, 4093]
    assert tok.eog == {0, 2, 4}  # <|endoftext|>, <|im_end|>, <reponame> (a FIM repo token)
    assert tok.eot == 2
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template


@pytest.mark.model
def test_smollm2_agrees_with_the_tokenizers_package():
    hf = pytest.importorskip("tokenizers")
    tok = load(smollm2_path())
    ref = hf.Tokenizer(hf.models.BPE(vocab={t: i for i, t in enumerate(tok.vocab.texts)},
                                     merges=[tuple(m.split(" ", 1)) for m in tok.vocab.merges]))
    ref.pre_tokenizer = hf.pre_tokenizers.Sequence([
        hf.pre_tokenizers.Split(hf.Regex(r"\p{N}"), behavior="isolated"),
        hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as fh:
        text = fh.read()
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids


def test_llama3_bos_and_eog():
    tok = load(vocab_path("llama-bpe"))
    assert tok.add_bos and tok.encode("Hi")[0] == 128000
    assert tok.encode("Hi", add_special=False) == tok.encode("Hi")[1:]
    assert tok.encode("<|eot_id|>", add_special=False, parse_special=True) == [128009]
    assert tok.eog == {128001, 128009} and tok.eot == 128009


# -- SPM ---------------------------------------------------------------------------------------
def test_spm_space_prefix_bos_and_byte_fallback():
    tok = load(vocab_path("llama-spm"))
    ids = tok.encode("Hello world")
    assert ids[0] == 1 and tok.decode(ids[1:]) == b" Hello world"
    assert tok.encode("", add_special=True) == [1] and tok.encode("", add_special=False) == []
    # invalid UTF-8 and an unknown character come out as <0xNN> byte tokens
    raw = b"a\xff\xc3(\xf0\x9f"
    ids = tok.encode(raw, add_special=False)
    assert tok.decode(ids) == b" " + raw
    assert [tok.token_text(i) for i in ids if tok.token_type[i] == 6][:2] == [b"<0xFF>",
                                                                              b"<0xC3>"]


def test_spm_special_token_restarts_the_space_prefix():
    tok = load(vocab_path("llama-spm"))
    ids = tok.encode("a</s>b", add_special=False, parse_special=True)
    assert 2 in ids and tok.decode(ids) == b" a</s> b"
    assert 2 not in tok.encode("a</s>b", add_special=False)


def test_phi3_user_defined_token_always_matches_and_strips_spaces():
    tok = load(vocab_path("phi-3"))
    # </s> is user-defined but end-of-generation, so llama.cpp marks it control: only parsed
    # with parse_special; <|end|> (control, rstrip on Phi-3) eats the spaces after it
    assert 2 not in tok.encode("x</s>y", add_special=False)
    a = tok.encode("<|end|>   x", add_special=False, parse_special=True)
    b = tok.encode("<|end|>x", add_special=False, parse_special=True)
    assert a == b and a[0] == 32007 and 32007 in tok.eog


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("over, error, match", [
    (dict(merges=None), InvalidValueError, "tokenizer.ggml.merges: missing"),
    (dict(merges=["a b", "a zz"]), InvalidValueError, r"merges\[1\].*'zz'"),
    (dict(merges=["ab"]), InvalidValueError, r"merges\[0\].*space"),
    (dict(model="wordpiece"), InvalidValueError, "model.*'wordpiece'"),
    (dict(pre="bloom"), InvalidValueError, "pre.*'bloom'"),
    (dict(token_type=([1, 1], gguf.GGUFValueType.INT32)), ShapeError, "token_type: 2 entries"),
    (dict(token_type=([1.0] * 8, gguf.GGUFValueType.FLOAT32)), DTypeError, "token_type"),
    (dict(bos_token_id="7"), DTypeError, "bos_token_id"),
    (dict(tokens=["a", "b", "c", "ab", "abc", "Ġ", "Ġa", "a"]), InvalidValueError,
     "tokens: b'a' at 0 and 7"),
    (dict(tokens=None), InvalidValueError, "tokenizer.ggml.tokens: missing"),
    (dict(add_bos_token=True, bos_token_id=None, eos_token_id=None, pre="gpt-2"), None, None),
])
def test_malformed_vocab_is_refused_naming_the_key(tmp_path, over, error, match):
    path = tiny_bpe(tmp_path, **over)
    if error is None:  # gpt2's default BOS (11) is out of this vocabulary's range
        with pytest.raises(InvalidValueError, match="add_bos_token"):
            tk.load(path)
        return
    with pytest.raises(error, match=match):
        tk.load(path)


def test_bad_files_and_arguments(tmp_path):
    with pytest.raises(InvalidValueError, match="no such file"):
        tk.load(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(ShapeError, match="not a GGUF"):
        tk.load(tmp_path / "junk.gguf")
    full = open(tiny_bpe(tmp_path), "rb").read()
    (tmp_path / "cut.gguf").write_bytes(full[:len(full) - 5])
    with pytest.raises(ShapeError, match="truncated"):
        tk.load(tmp_path / "cut.gguf")
    tok = tk.load(tiny_bpe(tmp_path))
    with pytest.raises(GgoptError, match="expected str or bytes"):
        tok.encode(12)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="token id 99"):
        tok.decode([99])


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe", "phi-3"])
def test_c_merges_equal_the_python_reference(name):
    """ggopt._kernels._merge gives the ids of the pure-Python merge loops, on GPL-3, on code
    with long runs of spaces and on invalid UTF-8 (SentencePiece's whole-text path)."""
    path = vocab_path(name)
    with open("/usr/share/common-licenses/GPL-3", "rb") as fh:
        texts = [fh.read(), b"def f(x):\n" + b" " * 40 + b"return x  # \xff\xc3(\xe2\x82",
                 "ünïcödé 日本語 😀 ١٢٣".encode()]
    fast, slow = tk.load(path), tk.load(path)
    model = slow._spm if slow._spm is not None else slow._bpe
    assert model is not None
    model.use_c = False
    for text in texts:
        assert fast.encode(text) == slow.encode(text)


def test_spm_word_split_only_when_no_token_has_an_inner_space():
    """Cutting text into words at spaces is exact only when no token holds a ``▁`` after
    another character; U+2596 shares two of ``▁``'s three UTF-8 bytes (a bytes.lstrip of
    them would wrongly skip it)."""
    from ggopt.tokenizers.spm import SpmModel

    space, quad = "\u2581".encode(), "\u2596".encode()
    base = {space + b"a": 0, b"a": 1, space: 2, quad: 3}
    assert SpmModel(base, [0.0] * 4)._word_split
    inner = {**base, quad + space: 4}
    model = SpmModel(inner, [0.0, 0.0, 0.0, 0.0, 5.0])
    assert not model._word_split
    assert model.encode(quad + space + b"a") == [4, 1]


@pytest.mark.model
def test_from_gguf_on_the_model_file_equals_load():
    """The model loader builds the tokenizer from its open GGUFReader (no second read)."""
    path = smollm2_path()
    a, b = tk.from_gguf(gguf.GGUFReader(path)), load(path)
    text = "The <|im_start|> 2024 café\n\n  x"
    for special in (False, True):
        assert a.encode(text, parse_special=special) == b.encode(text, parse_special=special)
    assert (a.eog, a.vocab.ids, a.chat_template) == (b.eog, b.vocab.ids, b.chat_template)


def test_decode_of_a_2d_array_is_a_shape_error(tmp_path):
    """Issue 32 row 17: ``decode(np.array([[104, 105]]))`` raised a raw TypeError."""
    import numpy as np

    tok = tk.load(write_vocab(tmp_path / "b.gguf", model="rwkv", tokens=BYTE_TOKENS))
    with pytest.raises(ShapeError, match=r"shape \(1, 2\)"):
        tok.decode(np.array([[104, 105]]))
    with pytest.raises(DTypeError, match="expected an int"):
        tok.decode([np.array([104, 105])])
    assert tok.decode(np.array([104, 105])) == b"hi"
    assert tok.decode(np.array([[104, 105]])[0]) == b"hi"
