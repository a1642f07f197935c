"""Chat templates under a budget (issue 32, rows 1-5): whatever a template from a file does at
compile or render time, the caller gets an InvalidValueError naming the file and the limit, in
bounded time and memory, and the next rendering works."""

from __future__ import annotations

import time

import pytest

import ggopt.tokenizers as tk
from ggopt.errors import InvalidValueError
from ggopt.tokenizers.chat import TemplateLimits

pytest.importorskip("jinja2")

LIMITS = TemplateLimits(seconds=3.0, memory_mb=400)
MSGS = [{"role": "user", "content": "Hi"}]
SOURCE = "/models/hostile.gguf"


def assert_refused(template: str, match: str) -> None:
    start = time.monotonic()
    with pytest.raises(InvalidValueError, match=match) as info:
        tk.render_chat(template, MSGS, limits=LIMITS, source=SOURCE)
    assert SOURCE in str(info.value)
    assert time.monotonic() - start < 60  # bounded (the limit is 3 s; a loaded machine)
    assert tk.render_chat("{{ messages[0].content }}!", MSGS, limits=LIMITS) == "Hi!"


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",  # row 1
    "{{ (9 ** (9 ** 9)) > 0 }}",  # row 2: folded at compile time
    "{{ lipsum(1000000000) | length }}",  # row 3
    "{{ [1] | slice(1000000000) | list | length }}",
], ids=["nested-range", "constant-folding", "lipsum", "slice"])
def test_hangs_end_at_the_time_limit(template):
    assert_refused(template, r"longer than the limit of 3 s \(TemplateLimits.seconds\)|"
                             r"memory limit")


@pytest.mark.parametrize("template", [
    "{{ ('a' * 10**10) | length }}",
    "{{ 'a' | center(10**10) | length }}",
    "{{ 'a' | indent(10**10) | length }}",
    "{{ {'a': 1} | tojson(indent=10**10) | length }}",
    "{{ '{:10000000000}'.format(1) | length }}",
    "{{ ('%10000000000d' % 1) | length }}",
    "{{ (messages * 10**9) | length }}",
    "{{ ('a' * 10**8) | length }}{{ ('b' * 10**8) | length }}{{ ('c' * 10**8) ~ ('d' * 10**8) "
    "~ ('e' * 10**8) }}",
], ids=["mul", "center", "indent", "tojson", "format", "percent", "list-mul", "many"])
def test_memory_ends_at_the_memory_limit(template):
    assert_refused(template, r"memory limit of 400 MB|limit of .* characters|longer than the limit")


@pytest.mark.parametrize("template, match", [
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nests too deeply"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ range(200000) | list | length }}", "range too big|OverflowError"),
    ("{% for a in messages %}" * 25 + "x" + "{% endfor %}" * 25, "nests too deeply|compile"),
    ("{% if true %}" * 200 + "x" + "{% endif %}" * 200, "nests too deeply|compile"),
    ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "nests too deeply|compile"),
], ids=["recursive-macro", "zero-division", "range", "nested-for", "nested-if", "parens"])
def test_python_errors_become_ggopt_errors(template, match):
    """Row 5: no raw RecursionError, ZeroDivisionError, OverflowError, SyntaxError or
    IndentationError (compile-time ones included)."""
    assert_refused(template, match)


def test_limits_are_checked_and_can_be_raised():
    for bad in ({"seconds": 0}, {"memory_mb": 1}, {"max_chars": 0}, {"seconds": "1"}):
        with pytest.raises(InvalidValueError, match="TemplateLimits"):
            TemplateLimits(**bad)  # type: ignore[arg-type]
    big = "{{ 'a' * 3000 }}"
    with pytest.raises(InvalidValueError, match="limit of 100 characters"):
        tk.render_chat(big, MSGS, limits=TemplateLimits(max_chars=100), source=SOURCE)
    assert tk.render_chat(big, MSGS, limits=TemplateLimits(max_chars=3000)) == "a" * 3000


def test_a_failure_in_a_batch_names_the_conversation():
    tmpl = ("{% for m in messages %}{% if m.content == 'boom' %}{{ 1 // 0 }}{% endif %}"
            "{{ m.role }}:{{ m.content }}\n{% endfor %}")
    good = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    bad = [{"role": "user", "content": "boom"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(InvalidValueError, match="conversation 2"):
        tk.chat_spans(tmpl, [good, bad, good], limits=LIMITS, source=SOURCE)
    text, cuts = tk.chat_spans(tmpl, [good], limits=LIMITS)[0]
    assert text == "user:q\nassistant:a\n"
    assert cuts == [(7, False), (len(text), True)]


def test_variables_must_be_json():
    with pytest.raises(InvalidValueError, match="JSON"):
        tk.render_chat("x", MSGS, tools=object())
