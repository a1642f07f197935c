"""Chat templates under a budget (issue 32): what the worker process costs.

``render`` rows: one conversation rendered through the worker (``render_chat``) and, as the
reference of the same run, the same compiled template rendered in this process; the ratio is
stored in ``extra_info``. ``spans`` rows: a conversation's cuts for chat SFT
(``conversations_ids``: one worker call, tokenization included) for 500 and 4,000 messages,
and a batch of 2,000 two-message conversations. SmolLM2's template and tokenizer come from
``$GGOPT_CACHE`` (default ``~/.cache/ggopt``); rows skip without them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import ggopt.tokenizers as tk
from ggopt.lm.chat import conversations_ids
from ggopt.tokenizers.chat_worker import make_environment

pytest.importorskip("jinja2")
MODEL = Path(os.environ.get("GGOPT_CACHE", Path.home() / ".cache/ggopt")) / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]


def _tok() -> tk.Tokenizer:
    if not MODEL.exists():
        pytest.skip(f"{MODEL} missing")
    return tk.load(MODEL)


def _conversation(n: int) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": f"message {i} hello"}
            for i in range(n)]


def _in_process_seconds(template: str, messages: list[dict[str, str]], rounds: int) -> float:
    compiled = make_environment().from_string(template)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        compiled.render(messages=messages, add_generation_prompt=False, bos_token="",
                        eos_token="")
        best = min(best, time.perf_counter() - start)
    return best


def test_render_through_the_worker(benchmark):
    tok = _tok()
    template = tok.chat_template
    assert template
    tk.render_chat(template, SHORT)  # the worker started and the template compiled
    benchmark(tk.render_chat, template, SHORT)
    ref = _in_process_seconds(template, SHORT, 200)
    benchmark.extra_info["in_process_ms"] = ref * 1e3
    benchmark.extra_info["ratio_to_in_process"] = benchmark.stats["min"] / ref


@pytest.mark.parametrize("n", [500, 4000])
def test_spans_of_one_long_conversation(benchmark, n):
    tok = _tok()
    conv = _conversation(n)
    ids, trained = benchmark.pedantic(lambda: conversations_ids(tok, [conv])[0], rounds=3)
    assert len(ids) > n and any(trained)
    benchmark.extra_info["messages"] = n


def test_spans_of_many_short_conversations(benchmark):
    tok = _tok()
    convs = [SHORT] * 2000
    out = benchmark.pedantic(lambda: conversations_ids(tok, convs), rounds=3)
    assert len(out) == 2000
    benchmark.extra_info["per_conversation_ms"] = benchmark.stats["min"] / 2000 * 1e3
