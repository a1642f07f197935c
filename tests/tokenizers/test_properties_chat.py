"""Structure-aware fuzzing of chat templates and model metadata (issue 32): templates built
from jinja2's grammar (loops, filters, big numbers, macros, string products) either render to
a str or raise InvalidValueError, within the budget; GGUF headers built from the format's
structure (every value type, nested arrays, huge counts, raw bytes) either load or raise a
GgoptError.

The number of examples comes from the hypothesis profile (tests/conftest.py): small by
default, thousands with ``GGOPT_HYPOTHESIS_PROFILE=fuzz``.
"""

from __future__ import annotations

import struct

import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("jinja2")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import ggopt.tokenizers as tk  # noqa: E402
from ggopt.errors import GgoptError, InvalidValueError  # noqa: E402
from ggopt.tokenizers.chat import TemplateLimits  # noqa: E402

LIMITS = TemplateLimits(seconds=2.0, memory_mb=300, max_chars=1 << 20)
MSGS = [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}]

_ATOMS = st.sampled_from([
    "1", "0", "-1", "9", "10**9", "9 ** (9 ** 9)", "'a'", "'x' * 10**8", "messages",
    "messages[0]", "messages[-1]['content']", "m", "m.content", "m.role", "loop.index",
    "none", "true", "[1, 2]", "{'a': 1}", "range(10)", "range(10**9)", "lipsum(10**6)",
    "bos_token", "add_generation_prompt", "''.__class__", "raise_exception('x')",
    "strftime_now('%Y')", "cycler", "namespace(a=1)", "undefined_name"])
_FILTERS = st.sampled_from([
    "", "|length", "|tojson", "|tojson(indent=10**9)", "|trim", "|list", "|slice(10**9)",
    "|center(10**9)", "|indent(10**9)", "|join(',')", "|string", "|upper", "|first",
    "|batch(3)", "|sum", "|sort", "|reverse", "|int", "|float", "|abs", "|round"])
_OPS = st.sampled_from(["+", "-", "*", "//", "/", "%", "**", "~", " and ", " or ", " == ",
                        " in ", " > "])


@st.composite
def _expr(draw, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return draw(_ATOMS) + draw(_FILTERS)
    return f"({draw(_expr(depth + 1))}{draw(_OPS)}{draw(_expr(depth + 1))}){draw(_FILTERS)}"


@st.composite
def _template(draw, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "expr", "for", "if", "set", "macro"]
                                    if depth < 3 else ["text", "expr"]))
        if kind == "text":
            parts.append(draw(st.sampled_from(["<s>", "\n", "x", "{{", "}}", "{%", "%}"])))
        elif kind == "expr":
            parts.append("{{ " + draw(_expr()) + " }}")
        elif kind == "for":
            parts.append("{% for m in " + draw(_expr()) + " %}" + draw(_template(depth + 1))
                         + "{% endfor %}")
        elif kind == "if":
            parts.append("{% if " + draw(_expr()) + " %}" + draw(_template(depth + 1))
                         + "{% else %}" + draw(_template(depth + 1)) + "{% endif %}")
        elif kind == "set":
            parts.append("{% set m = " + draw(_expr()) + " %}")
        else:
            parts.append("{% macro f(n) %}" + draw(_template(depth + 1)) + "{{ f(n) }}"
                         "{% endmacro %}{{ f(1) }}")
    return "".join(parts)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=_template())
def test_any_template_renders_or_raises_a_ggopt_error(template):
    try:
        out = tk.render_chat(template, MSGS, limits=LIMITS, source="fuzz.gguf",
                             bos_token="<s>")
    except InvalidValueError as exc:
        assert "chat template" in str(exc)
    else:
        assert isinstance(out, str) and len(out) <= LIMITS.max_chars


# --- GGUF headers -----------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}


def _string(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


@st.composite
def _value(draw, vtype: int, depth: int = 0) -> bytes:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        size = struct.calcsize(fmt)
        return draw(st.binary(min_size=size, max_size=size))
    if vtype == 8:
        return _string(draw(st.binary(max_size=12)))
    item = draw(st.sampled_from([4, 8, 9] if depth < 3 else [4, 8]))
    n = draw(st.integers(0, 4))
    count = draw(st.sampled_from([n, n, n, 1 << 40, (1 << 64) - 1]))
    body = b"".join(draw(_value(item, depth + 1)) for _ in range(n))
    return struct.pack("<IQ", item, count) + body


_KEYS = st.sampled_from([b"general.alignment", b"tokenizer.ggml.model", b"tokenizer.ggml.tokens",
                         b"tokenizer.ggml.merges", b"tokenizer.ggml.pre", b"llama.vocab_size",
                         b"tokenizer.chat_template", b"general.name", b"\xff\xfe", b""])


@st.composite
def _gguf(draw) -> bytes:
    kvs = []
    for _ in range(draw(st.integers(0, 5))):
        vtype = draw(st.sampled_from([4, 8, 9, 9, 0, 6, 7, 10, 13, 255]))
        value = draw(_value(vtype)) if vtype in (*_SCALARS, 8, 9) else b""
        kvs.append(_string(draw(_KEYS)) + struct.pack("<I", vtype) + value)
    n_kv = draw(st.sampled_from([len(kvs), len(kvs), len(kvs) + 1, 1 << 40]))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + b"".join(kvs)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                HealthCheck.function_scoped_fixture])
@given(data=_gguf())
def test_any_gguf_header_loads_or_raises_a_ggopt_error(tmp_path, data):
    from ggopt.models import llama

    path = tmp_path / "fuzz.gguf"
    path.write_bytes(data)
    for load in (tk.load, lambda p: llama.load(p, progress=False)):
        try:
            load(path)
        except GgoptError as exc:
            assert str(exc)
