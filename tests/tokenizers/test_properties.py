"""Property tests of ggopt.tokenizers: any bytes survive encode + decode on the byte-level
(``rwkv``) and the byte-fallback SPM vocabularies; special tokens come out as their ids only
when parsed; BOS/EOS only with ``add_special``; the C pre-tokenizer cuts random text as the
regexes do; a mutated vocabulary file loads or raises a GgoptError, nothing else.

The number of examples comes from the hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import functools

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import ggopt.tokenizers as tk  # noqa: E402
from ggopt.errors import GgoptError  # noqa: E402
from ggopt.tokenizers.pretokenize import PreTokenizer  # noqa: E402
from tests.support.tokenizer_files import (  # noqa: E402  # noqa: E402
    BYTE_TOKENS,
    smollm2_path,
    tiny_bpe,
    vocab_path,
    write_vocab,
)

load = functools.cache(tk.load)

# text that stresses the pre-tokenizers: letters, digits, spaces of every kind, apostrophes
_ALPHABET = st.sampled_from(list("aZé'sStTlLdD 1 2\t\n\r\u00a0\u2003\u3000!?.,-_😀日١½\u0301")
                            + ["'ll", "'RE", "  ", "\n\n", "\ud800"])
_TEXT = st.lists(_ALPHABET, max_size=40).map("".join)


@functools.cache
def _byte_vocab(tmp_dir: str) -> tk.Tokenizer:
    return tk.load(write_vocab(f"{tmp_dir}/bytes.gguf", model="rwkv",
                               tokens=BYTE_TOKENS))


@given(data=st.binary(max_size=300))
def test_byte_vocab_round_trip(tmp_path_factory, data):
    tok = _byte_vocab(str(tmp_path_factory.getbasetemp()))
    ids = tok.encode(data)
    assert ids == list(data) and tok.decode(ids) == data


@given(data=st.binary(max_size=120))
def test_spm_byte_fallback_round_trip(data):
    """Any bytes come back, after the space llama.cpp's SentencePiece puts in front
    (add_space_prefix). Spaces travel as ``▁`` (E2 96 81): where an invalid lead byte swallows
    part of one (b"\\xc0 "), llama.cpp writes those bytes as byte tokens, so the comparison
    counts ``▁`` and a space as the same."""
    tok = load(vocab_path("llama-spm"))
    ids = tok.encode(data, add_special=False)
    space = "\u2581".encode()
    expected = (b" " + data if data else b"")
    assert tok.decode(ids).replace(space, b" ") == expected.replace(space, b" ")
    assert tok.encode(data) == [tok.bos, *ids]


@given(text=st.text(max_size=60).filter(lambda t: "\u2581" not in t))
def test_spm_round_trip_valid_utf8(text):
    tok = load(vocab_path("llama-spm"))
    data = text.encode("utf-8", "surrogatepass")
    assert tok.decode(tok.encode(text, add_special=False)) == (b" " + data if data else b"")


@pytest.mark.model
@given(text=_TEXT)
def test_smollm2_round_trip_valid_utf8(text):
    tok = load(smollm2_path())
    assert tok.decode(tok.encode(text)) == text.encode("utf-8", "surrogatepass")


@given(text=_TEXT, pre=st.sampled_from(["gpt-2", "smollm", "llama-bpe", "qwen2"]))
def test_c_scanner_equals_regexes(text, pre):
    splitter = PreTokenizer(pre)
    words = splitter.split(text)
    assert words == splitter.split_regex(text) and "".join(words) == text


@pytest.mark.model
@given(left=_TEXT, right=_TEXT)
def test_special_tokens_only_when_parsed(left, right):
    tok = load(smollm2_path())
    text = f"{left}<|im_end|>{right}"
    parsed = tok.encode(text, parse_special=True)
    plain = tok.encode(text)
    assert parsed == tok.encode(left) + [2] + tok.encode(right)
    assert 2 not in plain and tok.decode(plain) == tok.decode(parsed)


@given(text=_TEXT, add_special=st.booleans())
def test_bos_eos_follow_the_vocabulary(tmp_path_factory, text, add_special):
    base = tmp_path_factory.getbasetemp()
    path = base / "bos_eos.gguf"
    if not path.exists():
        tiny_bpe(base, add_bos_token=True, add_eos_token=True)
        (base / "bpe.gguf").rename(path)
    tok = load(path)
    ids = tok.encode(text, add_special=add_special)
    inner = tok.encode(text, add_special=False)
    assert ids == ([7, *inner, 7] if add_special else inner)


@given(cut=st.integers(0, 400), flip=st.integers(0, 400), value=st.integers(0, 255))
def test_mutated_vocab_file_loads_or_raises_ggopt_error(tmp_path_factory, cut, flip, value):
    base = tmp_path_factory.getbasetemp()
    good = base / "bpe.gguf"
    if not good.exists():
        tiny_bpe(base)
    data = bytearray(good.read_bytes())
    if flip < len(data):
        data[flip] = value
    data = data[:max(len(data) - cut, 0)] if cut % 2 else data
    bad = base / f"mut_{cut}_{flip}_{value}.gguf"
    bad.write_bytes(bytes(data))
    try:
        tok = tk.load(bad)
    except GgoptError:
        return
    assert isinstance(tok.encode("abc"), list)
    bad.unlink()


def _partition_before(tok: tk.Tokenizer, data: bytes, parse_special: bool) -> list:
    """The special-token partition as main cut it before issue 32 (quadratic: the rest of
    the text copied after every match), the reference of the linear one."""
    from ggopt.tokenizers.special import Attr

    frags: list = [data]
    v = tok.vocab
    for tid in v.special_order:
        attr = v.attrs[tid]
        if not parse_special and attr & (Attr.CONTROL | Attr.UNKNOWN):
            continue
        text = v.tokens[tid]
        if not any(isinstance(f, bytes) and text in f for f in frags):
            continue
        new: list = []
        for frag in frags:
            if isinstance(frag, int) or text not in frag:
                new.append(frag)
                continue
            rest = frag
            while True:
                pos = rest.find(text)
                if pos < 0:
                    if rest:
                        new.append(rest)
                    break
                left = rest[:pos]
                if attr & Attr.LSTRIP:
                    left = left.rstrip(b" \t\n\v\f\r")
                if left:
                    new.append(left)
                new.append(tid)
                rest = rest[pos + len(text):]
                if attr & Attr.RSTRIP:
                    rest = rest.lstrip(b" \t\n\v\f\r")
        frags = new
    return frags


_SPECIAL_PIECES = st.sampled_from(["<|end|>", "<|user|>", "</s>", "<s>", "<|im_start|>",
                                   "<|im_end|>", "<|endoftext|>", " ", "  ", "\n", "\t", "x",
                                   "hi", "<|", "|>", "é", "<"])


@pytest.mark.parametrize("name", ["phi-3", "smollm2"])
@given(pieces=st.lists(_SPECIAL_PIECES, max_size=60), parse_special=st.booleans())
def test_special_partition_equals_the_quadratic_one(name, pieces, parse_special):
    """Issue 32 row 14: ``encode(parse_special=True)`` on chat text was quadratic (8 MB:
    16 s); the linear partition cuts exactly as before (Phi-3's rstrip/lstrip tokens
    included)."""
    tok = load(smollm2_path() if name == "smollm2" else vocab_path(name))
    data = "".join(pieces).encode()
    assert tok._partition(data, parse_special) == _partition_before(tok, data, parse_special)


def _rwkv_before(model, data: bytes) -> list[int] | None:
    """main's greedy loop before issue 32 (every length from the longest token's down)."""
    out, i, n = [], 0, len(data)
    while i < n:
        for length in range(min(model._max_len, n - i), 0, -1):
            tid = model._ids.get(data[i:i + length])
            if tid is not None:
                out.append(tid)
                i += length
                break
        else:
            return None
    return out


@given(extra=st.lists(st.binary(min_size=2, max_size=40), max_size=6),
       data=st.binary(max_size=200), long=st.integers(50, 4000))
def test_rwkv_longest_match_equals_the_quadratic_one(extra, data, long):
    """Issue 32 row 16: a byte vocabulary with one 4,000-byte token took 51 s for 16 KB (every
    length tried at every position); the lookups of the token lengths only cut the same."""
    from ggopt.errors import InvalidValueError
    from ggopt.tokenizers.rwkv import RwkvModel

    def escape(piece: bytes) -> bytes:
        return b"".join(b"\\x%02x" % b for b in piece)

    pieces = [bytes([b]) for b in range(256)] + [b"a" * long] + extra
    model = RwkvModel([escape(p) for p in pieces])
    text = data + b"a" * (long + 3) + data
    assert model.encode(text) == _rwkv_before(model, text)
    partial = RwkvModel([escape(p) for p in pieces[97:]])  # no token for most bytes
    want = _rwkv_before(partial, text)
    if want is None:
        with pytest.raises(InvalidValueError, match="no rwkv token"):
            partial.encode(text)
    else:
        assert partial.encode(text) == want


_DEEPSEEK_TEXT = st.lists(st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "\u3000", "中", "文",
                                           "한", "a", "Zé", "1", "23", "!", ",", "\u00a0",
                                           "\u2003", "µ"]), max_size=50).map("".join)


@given(text=_DEEPSEEK_TEXT)
def test_deepseek_llm_trailing_spaces_equal_the_quadratic_regex(text):
    """Issue 32 row 15: ``\\s+$`` retried at every space of a run before a CJK character
    (100,000 spaces: 176 s); the run-start form cuts the same words."""
    from ggopt.tokenizers.pretokenize import PreTokenizer

    new = PreTokenizer("deepseek-llm")
    old = PreTokenizer("deepseek-llm")
    old._regexes = tuple(r"\s+$" if r.startswith("(?<!") else r for r in old._regexes)
    assert old._regexes != new._regexes
    assert new.split_regex(text) == old.split_regex(text)
