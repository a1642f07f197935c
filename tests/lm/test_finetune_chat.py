"""Chat SFT data: the template rendered, the loss only on the assistant's tokens,
bad files and templates refused."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import gguf
import pytest

import ggopt.tokenizers as tk
from ggopt.errors import InvalidValueError, OutOfMemoryError, ShapeError, StateError
from ggopt.lm.chat import chat_windows, conversation_ids, read_conversations
from ggopt.lm.windows import MASKED
from ggopt.tokenizers import Tokenizer
from tests.support.tokenizer_files import BYTE_TOKENS
from tools.smollm import q4_1_path

CHATML = ("{% for m in messages %}{{ '<s>' + m['role'] + '\n' + m['content'] + '</s>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}")
CONV = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


@functools.cache
def _Tok(template: str | None = CHATML) -> Tokenizer:  # noqa: N802 - reads like a class
    """ggopt's byte vocabulary (llama.cpp's rwkv, ids = bytes) with ``template`` as its chat
    template, loaded from a GGUF file like any other."""
    path = Path(tempfile.mkdtemp()) / "byte-chat.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", "rwkv")
    w.add_array("tokenizer.ggml.tokens", BYTE_TOKENS)
    if template is not None:
        w.add_string("tokenizer.chat_template", template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return tk.load(path)


def _write(tmp_path, lines) -> str:
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    return str(path)


def test_only_the_assistant_is_trained(tmp_path):
    tok = _Tok()
    ids, trained = conversation_ids(tok, CONV)
    assert bytes(ids).decode() == "".join(f"<s>{m['role']}\n{m['content']}</s>\n" for m in CONV)
    assert bytes(i for i, t in zip(ids, trained, strict=True) if t) == b"hello</s>\n4</s>\n"
    convs = read_conversations(_write(tmp_path, [{"messages": CONV}]))
    w = chat_windows(tok, convs, 80)
    n = len(ids) - 1
    assert list(w.tokens[0, :n]) == ids[:-1]
    labels = w.labels[0]
    assert bytes(int(x) for x in labels if x != MASKED) == b"hello</s>\n4</s>\n"
    assert (labels[n:] == MASKED).all()
    with pytest.raises(ShapeError, match=f"has {len(ids)} tokens"):
        chat_windows(tok, convs, 20, "error")


@pytest.mark.parametrize("line, match", [
    ("not json", "not JSON"), ({"msgs": []}, "expected an object"),
    ({"messages": [{"role": "user"}]}, "string 'role' and 'content'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "no assistant"),
])
def test_bad_jsonl(tmp_path, line, match):
    with pytest.raises(InvalidValueError, match=match):
        read_conversations(_write(tmp_path, [{"messages": CONV}, line]))


def test_missing_file_and_empty(tmp_path):
    with pytest.raises(InvalidValueError, match="cannot read"):
        read_conversations(tmp_path / "none.jsonl")
    with pytest.raises(InvalidValueError, match="no conversations"):
        read_conversations(_write(tmp_path, ["", "  "]))


@pytest.mark.parametrize("template, match", [
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", "TypeError"),
    ("{% if %}", "does not compile"),
])
def test_failing_templates(template, match):
    with pytest.raises(InvalidValueError, match=match):
        conversation_ids(_Tok(template), CONV)


def test_no_template():
    with pytest.raises(StateError, match="chat_template"):
        conversation_ids(_Tok(None), CONV)


def test_template_that_is_not_a_prefix():
    tmpl = "{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(InvalidValueError, match="does not extend"):
        conversation_ids(_Tok(tmpl), CONV)


@pytest.mark.model
def test_smollm2_chatml():
    from gguf import GGUFReader

    from ggopt import tokenizers
    tok = tokenizers.from_gguf(GGUFReader(q4_1_path()))
    ids, trained = conversation_ids(tok, CONV)
    assert ids[0] == tok.bos  # <|im_start|> parsed as the special token
    answer = [i for i, t in zip(ids, trained, strict=True) if t]
    assert tok.decode(answer) == b"hello<|im_end|>\n4<|im_end|>\n"
    assert answer.count(tok.eos) == 2


@pytest.mark.parametrize("line", ['{"messages": 1' + "0" * 5000 + "}", "[" * 100000 + "]" * 100000],
                         ids=["long int", "deep nest"])
def test_json_beyond_the_parser_limits(tmp_path, line):
    """An int of more than 4300 digits (ValueError) or a deep nest (RecursionError) escaped
    as raw exceptions."""
    with pytest.raises(InvalidValueError, match="line 2 is not JSON"):
        read_conversations(_write(tmp_path, [{"messages": CONV}, line]))


@pytest.mark.parametrize("n_ctx, exc, match", [
    (0, ShapeError, "int >= 1"), (-1, ShapeError, "int >= 1"), ("32", ShapeError, "int >= 1"),
    (2**62, OutOfMemoryError, "no memory"),
])
def test_chat_windows_bad_context(n_ctx, exc, match):
    with pytest.raises(exc, match=match):
        chat_windows(_Tok(), [CONV], n_ctx)


def test_conversation_of_no_tokens():
    with pytest.raises(ShapeError, match="renders to 0 token"):
        chat_windows(_Tok("{% for m in messages %}{% endfor %}"), [CONV], 32)


def test_template_without_the_assistant_text_is_refused():
    """Issue 32 row 7: a template that never renders the assistant's text trained over 0
    tokens (loss nan) and wrote the input model back."""
    silent = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}" \
             "{% endfor %}"
    with pytest.raises(InvalidValueError, match="no assistant token to train"):
        chat_windows(_Tok(silent), [CONV, CONV], 64)


@pytest.mark.parametrize("overflow", ["truncate", "skip", "error"])
def test_long_conversation_among_short_ones(overflow):
    """Issue 32 row 8: one conversation longer than --ctx aborted the whole run."""
    tok = _Tok()
    long = [{"role": "user", "content": "q" * 30}, {"role": "assistant", "content": "a" * 200}]
    convs = [CONV] * 5 + [long] + [CONV] * 3
    n_ctx = 100
    if overflow == "error":
        with pytest.raises(ShapeError, match="conversation 6 has"):
            chat_windows(tok, convs, n_ctx, overflow)
        return
    w = chat_windows(tok, convs, n_ctx, overflow)
    ids, trained = conversation_ids(tok, long)
    lost = sum(trained[n_ctx + 1:]) if overflow == "truncate" else sum(trained[1:])
    assert w.overflow.lost_tokens == lost > 0
    assert "warning: chat data:" in w.overflow.line(n_ctx)
    short = chat_windows(tok, [CONV], n_ctx)
    if overflow == "skip":
        assert len(w) == 8 and w.overflow.skipped == 1 and w.overflow.truncated == 0
        assert (w.tokens[5] == short.tokens[0]).all()
        return
    assert len(w) == 9 and w.overflow.truncated == 1 and w.overflow.skipped == 0
    assert list(w.tokens[5]) == ids[:n_ctx]  # the conversation's start
    labels = w.labels[5]
    expect = [t if a else MASKED for t, a in zip(ids[1:n_ctx + 1], trained[1:n_ctx + 1],
                                                 strict=True)]
    assert list(labels) == expect  # the loss on the assistant tokens that fit
    assert short.overflow.line(n_ctx) == ""


def test_every_conversation_skipped():
    long = [{"role": "user", "content": "q" * 30}, {"role": "assistant", "content": "a" * 200}]
    with pytest.raises(InvalidValueError, match="all 2 conversations are longer"):
        chat_windows(_Tok(), [long, long], 32, "skip")
    with pytest.raises(InvalidValueError, match="overflow must be one of"):
        chat_windows(_Tok(), [CONV], 32, "wrap")


def test_a_long_conversation_renders_once():
    """Issue 32 row 6: every prefix was rendered (16,000 messages: 151 s). The cuts now come
    from a handful of renderings, identical to every prefix's."""
    from ggopt.lm.chat import conversations_ids
    from ggopt.tokenizers import chat_worker

    class Counting:
        def __init__(self, compiled):
            self.compiled, self.calls = compiled, 0

        def render(self, **kw):
            self.calls += 1
            return self.compiled.render(**kw)

    compiled = Counting(chat_worker.make_environment().from_string(CHATML))
    conv = [{"role": ("user", "assistant")[i % 2], "content": f"m{i}"} for i in range(16000)]
    text, cuts = chat_worker.spans(compiled, conv, {}, 1 << 30, fast_from=8)
    assert compiled.calls <= 32
    assert text.count("</s>") == 16000 and len(cuts) == 16000 + 8000
    tok = _Tok()
    some = conv[:300]
    assert conversations_ids(tok, [some], fast_from=8) == conversations_ids(
        tok, [some], fast_from=10**6)


def test_one_bos_when_the_template_renders_it():
    # a vocabulary that adds BOS (SmolLM2's with add_bos set) and a template that renders
    # bos_token: one BOS, not two (llama.cpp warns of the double BOS); without bos_token in
    # the template the vocabulary's BOS is added
    import dataclasses

    base = tk.load(q4_1_path())
    tok = Tokenizer(dataclasses.replace(base.vocab, add_bos=True))
    with_bos = tok.with_chat_template("{{ bos_token }}" + CHATML)
    without = tok.with_chat_template(CHATML)
    ids, _ = conversation_ids(with_bos, CONV)
    assert ids[0] == tok.bos and ids[1] != tok.bos
    assert conversation_ids(without, CONV)[0] == ids
    assert tok.chat_template == base.chat_template  # with_chat_template: a new tokenizer
