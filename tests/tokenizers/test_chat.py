"""Chat templates rendered as Hugging Face does, on real templates (llama.cpp's
``models/templates/*.jinja`` and SmolLM2's own); the expected strings follow from reading each
template."""

from __future__ import annotations

import pytest

import ggopt.tokenizers as tk
from ggopt.errors import InvalidValueError
from tests.support.tokenizer_files import TEMPLATES, smollm2_path

pytest.importorskip("jinja2")

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


def template(name: str) -> str:
    path = TEMPLATES / f"{name}.jinja"
    if not path.exists():
        pytest.skip(f"{path} missing (llama.cpp's models/templates)")
    return path.read_text()


def render(name: str, messages=CHAT, **kw) -> str:
    return tk.render_chat(template(name), messages, bos_token="<s>", eos_token="</s>", **kw)


def test_chatml_qwen25():
    assert render("Qwen-Qwen2.5-7B-Instruct", add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n")
    # no system message: Qwen's default one
    assert render("Qwen-Qwen2.5-7B-Instruct", CHAT[1:2]).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_llama31_date_and_headers():
    assert render("meta-llama-Llama-3.1-8B-Instruct", add_generation_prompt=True) == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
        "2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_phi35_generation_prompt_or_eos():
    name = "microsoft-Phi-3.5-mini-instruct"
    body = ("<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
            "<|user|>\n2+2?<|end|>\n")
    assert render(name, add_generation_prompt=True) == body + "<|assistant|>\n"
    assert render(name) == body + "</s>"


def test_mistral_nemo_puts_the_system_message_in_the_last_turn():
    assert render("mistralai-Mistral-Nemo-Instruct-2407") == (
        "<s>[INST]Hi[/INST]Hello!</s>[INST]Be brief.\n\n2+2?[/INST]")


def test_raise_exception_becomes_a_ggopt_error():
    with pytest.raises(InvalidValueError, match="System role not supported"):
        render("google-gemma-2-2b-it")
    assert render("google-gemma-2-2b-it", CHAT[1:2], add_generation_prompt=True) == (
        "<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")


def test_tojson_strftime_and_bad_templates():
    out = tk.render_chat("{{ messages | tojson }}|{{ strftime_now('%Y') | length }}",
                         [{"role": "user", "content": "é"}])
    assert out == '[{"role": "user", "content": "é"}]|4'
    with pytest.raises(InvalidValueError, match="does not compile"):
        tk.render_chat("{% for %}", [])
    with pytest.raises(InvalidValueError, match="failed to render"):
        tk.render_chat("{{ messages[5]['content'] + 1 }}", [])
    with pytest.raises(InvalidValueError, match="failed to render"):
        tk.render_chat("{{ ''.__class__.__mro__ }}{{ messages.append(1) }}", [])
    with pytest.raises(InvalidValueError, match="messages"):
        tk.render_chat("x", "hello")  # type: ignore[arg-type]


def test_strftime_now_follows_source_date_epoch(monkeypatch):
    """SOURCE_DATE_EPOCH (seconds since 1970, UTC) pins strftime_now; a malformed value is the
    render's error, named."""
    from ggopt.tokenizers import chat

    try:
        monkeypatch.setenv("SOURCE_DATE_EPOCH", "1796364000")
        chat._close_all()
        assert tk.render_chat("{{ strftime_now('%d %b %Y %H:%M') }}", []) == "04 Dec 2026 06:00"
        monkeypatch.setenv("SOURCE_DATE_EPOCH", "tomorrow")
        chat._close_all()
        with pytest.raises(InvalidValueError, match="SOURCE_DATE_EPOCH must be whole seconds"):
            tk.render_chat("{{ strftime_now('%Y') }}", [])
        assert tk.render_chat("{{ 1 + 1 }}", []) == "2"  # the worker still serves
    finally:
        monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
        chat._close_all()


@pytest.mark.model
def test_smollm2_own_template():
    tok = tk.load(smollm2_path())
    assert tok.apply_chat_template(CHAT[1:], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
        "<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(tok.apply_chat_template(CHAT[1:2]), parse_special=True)
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> ... two <|im_end|>


def _golden_outcome(fn) -> str:
    import hashlib
    import json

    try:
        return hashlib.sha256(json.dumps(fn(), ensure_ascii=False).encode()).hexdigest()
    except InvalidValueError as exc:
        return f"error {type(exc).__name__}"


@pytest.fixture
def golden_day(monkeypatch):
    """strftime_now pinned to the day the golden file was recorded, in fresh workers (a
    worker reads the environment it starts with); fresh ones again afterwards."""
    from ggopt.tokenizers import chat
    from tools.chat_golden import GOLDEN_EPOCH

    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(GOLDEN_EPOCH))
    chat._close_all()
    yield
    chat._close_all()


@pytest.mark.model
@pytest.mark.parametrize("fast_from", [1, 1000], ids=["one-render", "every-prefix"])
def test_real_templates_render_as_before(fast_from, golden_day):
    """Every template of llama.cpp's models/templates and SmolLM2's own renders, and masks
    the SmolLM2 tokenizer's conversations, byte for byte as main did before the worker
    (tests/data/chat_golden.json, tools/chat_golden.py), one-render cuts included, on the
    golden's day (templates that print the date)."""
    import copy
    import dataclasses
    import json
    from pathlib import Path

    from ggopt.lm.chat import conversations_ids
    from tools.chat_golden import CONVERSATIONS

    golden = json.loads((Path(__file__).resolve().parents[1] / "data" /
                         "chat_golden.json").read_text())
    if not TEMPLATES.exists():
        pytest.skip(f"{TEMPLATES} missing")
    tok = tk.load(smollm2_path())
    names = {p.stem: p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))}
    names["SmolLM2-own"] = tok.chat_template
    assert set(names) == set(golden)
    checked = 0
    for name, text in names.items():
        clone = copy.copy(tok)
        clone.vocab = dataclasses.replace(tok.vocab, chat_template=text)
        for cname, msgs in CONVERSATIONS.items():
            for gen in (False, True):
                got = _golden_outcome(lambda t=text, m=msgs, g=gen: tk.render_chat(
                    t, m, add_generation_prompt=g, bos_token="<s>", eos_token="</s>"))
                assert got == golden[name][f"{cname} gen={gen}"], (name, cname, gen)
            got = _golden_outcome(lambda c=clone, m=msgs: conversations_ids(
                c, [m], fast_from=fast_from)[0])
            assert got == golden[name][f"{cname} masks"], (name, cname)
            checked += 1
    assert checked == 4 * len(golden)


def test_gemma3_builtin_renders_gemmas_turns():
    from ggopt.tokenizers.templates import BUILTIN, GEMMA3, resolve_template
    assert resolve_template("gemma3") == resolve_template("gemma") == GEMMA3 == BUILTIN["gemma3"]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello\n"}, {"role": "user", "content": "Bye"}]
    got = tk.render_chat(GEMMA3, chat, add_generation_prompt=True, bos_token="<bos>")
    assert got == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                   "<start_of_turn>model\nHello<end_of_turn>\n"
                   "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(InvalidValueError, match="roles must alternate"):
        tk.render_chat(GEMMA3, chat[2:], bos_token="<bos>")


def test_template_files_are_read_and_checked(tmp_path):
    from ggopt.tokenizers.templates import MAX_TEMPLATE_BYTES, resolve_template
    good = tmp_path / "t.jinja"
    good.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert resolve_template(good) == good.read_text()
    cases = {"missing.jinja": (None, "not a built-in template .* not a readable file"),
             "latin1.jinja": (b"caf\xe9", "not UTF-8"),
             "empty.jinja": (b" \n", "empty"),
             "big.jinja": (b"x" * (MAX_TEMPLATE_BYTES + 1), "larger than"),
             "syntax.jinja": (b"{% for %}", "does not compile"),
             "raises.jinja": (b"{{ raise_exception('no') }}", "no")}
    for name, (data, match) in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(InvalidValueError, match=match) as info:
            resolve_template(str(tmp_path / name), option="--chat-template")
        assert "--chat-template" in str(info.value)
    with pytest.raises(InvalidValueError, match="expected a template file"):
        resolve_template("")
