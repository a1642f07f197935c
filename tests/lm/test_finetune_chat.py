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
        chat_windows(tok, convs, 20)


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
