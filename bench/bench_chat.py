"""Chat templates under a budget (issue 32): what the worker process costs.

``render`` rows: one conversation rendered through the worker (``render_chat``) and, as the
reference of the same run, the same compiled template rendered in this process; the ratio is
stored in ``extra_info``. ``spans`` rows: a conversation's cuts for chat SFT
(``conversations_ids``: one worker call, tokenization included) for 500 and 4,000 messages,
and a batch of 2,000 two-message conversations. SmolLM2's template and tokenizer come from
``$GGOPT_CACHE`` (default ``~/.cache/ggopt``); rows skip without them.

Packing (``--chat-pack``): real tokens/s of LoRA training on SmolLM2 (the F32 copy) with
packed windows beside padded ones of short exchanges at ctx 512, and (slow) the held-out loss
after one epoch packed and padded at ctx 128.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

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


# --- packing (issue 32): tokens/s and held-out loss, packed windows beside padded ones -------
F32_MODEL = MODEL.with_name("SmolLM2-135M-Instruct.F32.gguf")


def _exchanges(n: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` short arithmetic exchanges (about 40 tokens each with SmolLM2's template and its
    default system prompt)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for a, b in rng.integers(2, 60, (n, 2)):
        out.append([{"role": "user", "content": f"What is {a} plus {b}?"},
                    {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}])
    return out


def _smollm_lora() -> Any:
    from ggopt.lm import lora
    from ggopt.models.llama import load

    if not F32_MODEL.exists():
        pytest.skip(f"{F32_MODEL} missing")
    model = load(F32_MODEL, progress=False)
    lora.attach(model.net, lora.create(model.net, 8, 16.0, seed=1))
    return model


@pytest.mark.parametrize("ctx", [512])
def test_packed_vs_padded_tokens_per_second(benchmark, ctx):
    """Real (conversation) tokens per second of LoRA training on SmolLM2 at ``ctx``, packed
    windows beside padded ones (one conversation each, the reference), two windows of each
    per round; ``extra_info``: both rates, their ratio, the conversations per packed window
    and the load average."""
    from ggopt.lm.chat import chat_windows
    from ggopt.lm.finetune import FinetuneParams, FineTuner

    model = _smollm_lora()
    tok = model.require_tokenizer()
    convs = _exchanges(64, 0)
    fp = FinetuneParams(n_batch=1, n_ubatch=1, lr=1e-4, val_split=0.0)
    rates = {}
    for pack in (False, True):
        w = chat_windows(tok, convs, ctx, pack=pack)
        w = type(w)(w.tokens[:2], w.labels[:2], segments=None if w.segments is None
                    else w.segments[:2], lengths=w.lengths[:2])
        ft = FineTuner(model.net, w, fp)
        ft.train_epoch()  # warm: the graph planned, the buffers allocated
        ft.train_tokens = ft.real_tokens = 0
        ft.train_seconds = 0.0
        if pack:
            benchmark.pedantic(ft.train_epoch, rounds=2)
        else:
            for _ in range(2):
                ft.train_epoch()
        rates[pack] = ft.real_tokens / ft.train_seconds
        benchmark.extra_info[f"{'packed' if pack else 'padded'}_tokens_per_s"] = rates[pack]
        if pack:
            benchmark.extra_info["conversations_per_window"] = \
                len(set(w.segments[0].tolist()) - {-1})
        ft.close()
    benchmark.extra_info["ratio_packed_to_padded"] = rates[True] / rates[False]
    benchmark.extra_info["load_average"] = os.getloadavg()[0]
    assert rates[True] > rates[False]


@pytest.mark.slow
def test_held_out_loss_after_one_epoch_packed_vs_padded(benchmark):
    """LoRA on SmolLM2, one epoch over 36 exchanges at ctx 128, then the mean loss over the
    trained tokens of 12 held-out ones (padded windows): padded with --batch 1 and 2, packed
    with --batch 1 (two conversations of about 50 tokens per window: the same conversations
    per step as padded --batch 2). ``extra_info``: the losses before and after, the optimizer
    steps and the seconds."""
    from ggopt.lm import lora
    from ggopt.lm.chat import chat_windows
    from ggopt.lm.finetune import FinetuneParams, FineTuner

    model = _smollm_lora()
    net, tok = model.net, model.require_tokenizer()
    train, held = _exchanges(36, 1), _exchanges(12, 2)
    evaluate = FineTuner(net, chat_windows(tok, train + held, 128),
                         FinetuneParams(val_split=0.25))
    assert evaluate.n_val_mb == 12
    before = evaluate.validate().loss
    evaluate.close()
    benchmark.extra_info["held_out_before"] = before

    def run() -> None:
        for name, pack, batch in (("padded_b1", False, 1), ("padded_b2", False, 2),
                                  ("packed_b1", True, 1)):
            fresh = lora.create(net, 8, 16.0, seed=1)
            lora.attach(net, fresh)
            ft = FineTuner(net, chat_windows(tok, train, 128, pack=pack),
                           FinetuneParams(n_batch=batch, lr=1e-3, val_split=0.0))
            ft.train_epoch()
            benchmark.extra_info[f"{name}_steps"] = ft.steps_per_epoch
            benchmark.extra_info[f"{name}_seconds"] = ft.train_seconds
            ft.close()
            ev = FineTuner(net, chat_windows(tok, train + held, 128),
                           FinetuneParams(val_split=0.25))
            benchmark.extra_info[f"{name}_held_out"] = ev.validate().loss
            ev.close()

    benchmark.pedantic(run, rounds=1)
    benchmark.extra_info["load_average"] = os.getloadavg()[0]
    info = benchmark.extra_info
    assert info["packed_b1_held_out"] < before
