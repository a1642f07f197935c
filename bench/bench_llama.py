"""SmolLM2-135M in ggopt beside llama.cpp (llama-cpp-python): load time of the shipped Q4_1
file, generation tokens/s on the F32 copy (goal: at least 0.7x llama.cpp's), and evaluation
(perplexity windows) tokens/s.

Needs the model in ``GGOPT_CACHE`` (``~/.cache/ggopt``; skipped otherwise); the llama.cpp rows
need ``llama_cpp``. Both sides run on ``GGOPT_BENCH_THREADS`` threads (default 2), llama.cpp
with an F32 KV cache and flash attention off. Run with ``pytest bench/bench_llama.py``; the
ggopt rows store ``ratio_vs_llama_cpp`` (above 1 is faster). ``test_generate_alternating``
times both sides round by round (llama.cpp, then ggopt), the fairer comparison on a shared
machine: its ``min_ratio_vs_llama_cpp`` and ``median_ratio_vs_llama_cpp`` are the numbers to
quote. Run with ``GOMP_SPINCOUNT=30000`` (bench/README.md: the torch import in conftest.py
otherwise gives both sides libgomp's default wait, 2.5x slower here).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ggopt
from ggopt.lm import Generator
from ggopt.lm.perplexity import perplexity
from ggopt.models import llama

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.smollm import (  # noqa: E402
    f32_path,
    llama_cpp_model,
    llama_cpp_perplexity,
    q4_1_path,
    quantized_path,
)

pytestmark = pytest.mark.usefixtures("bench_threads")

N_GEN = 32
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 2, 198, 1, 4093]
EVAL_CTX = 256
_RESULTS: dict[tuple[str, str], object] = {}  # (test, impl) -> its output, compared across impls


def assert_same_output(test: str, impl: str, value: object) -> None:
    """Both implementations must produce the same output (the benchmark checks what it times)."""
    _RESULTS[(test, impl)] = value
    other = _RESULTS.get((test, "llama_cpp" if impl == "ggopt" else "ggopt"))
    if other is not None:
        if isinstance(value, float):
            assert isinstance(other, float) and abs(value / other - 1) < 5e-3, (value, other)
        else:
            assert value == other


def _cpp(n_ctx: int):
    llm = llama_cpp_model(f32_path(), n_ctx)
    llm.set_cache(None)
    return llm


@pytest.fixture(scope="module")
def f32_model():
    return llama.load(f32_path(), progress=False)


@pytest.mark.benchmark(group="load SmolLM2 Q4_1 (dequantized to F32)")
def test_load_q4_1(benchmark):
    path = q4_1_path()
    model = benchmark.pedantic(lambda: llama.load(path, progress=False), rounds=3)
    assert model.cfg.n_layer == 30
    benchmark.extra_info["load_seconds"] = round(model.load_seconds, 3)


def _generator(model) -> Generator:
    """Made once per benchmark, outside the timed rounds, as llama.cpp's context is."""
    return Generator(model, len(PROMPT) + N_GEN)


def _greedy_ggopt(gen: Generator) -> list[int]:
    gen.reset()  # as llm.reset() on llama.cpp's side: the graphs built and planned stay
    z = gen.feed(PROMPT)
    out = []
    for _ in range(N_GEN):
        out.append(int(np.argmax(z)))
        z = gen.feed([out[-1]])
    return out


def _greedy_cpp(llm) -> list[int]:
    llm.reset()
    llm.eval(PROMPT)
    out = []
    for _ in range(N_GEN):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


@pytest.mark.benchmark(group=f"generate {N_GEN} tokens, SmolLM2 F32, KV cache")
@pytest.mark.parametrize("impl", ["llama_cpp", "ggopt"])
def test_generate(benchmark, ratio_to, impl, f32_model):
    if impl == "llama_cpp":
        llm = _cpp(len(PROMPT) + N_GEN + 1)
        llm.n_threads = ggopt.get_n_threads()

        def run() -> list[int]:
            return _greedy_cpp(llm)
    else:
        gen = _generator(f32_model)

        def run() -> list[int]:
            return _greedy_ggopt(gen)

    t0 = time.perf_counter()
    tokens = benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    benchmark.extra_info["tokens_per_second_incl_prompt"] = round(
        4 * N_GEN / (time.perf_counter() - t0), 2)
    assert len(tokens) == N_GEN
    assert_same_output("generate", impl, tokens)  # greedy: the same tokens
    ratio_to(impl, llama_cpp=0.7 if impl == "ggopt" else None)


def _after_warm_up(rounds: list) -> list:
    """The timed rounds: all but the warm-up (the one round ``--benchmark-disable`` runs)."""
    return rounds[1:] if len(rounds) > 1 else rounds


@pytest.mark.benchmark(group=f"generate {N_GEN} tokens, alternating rounds")
def test_generate_alternating(benchmark, f32_model):
    """Each round generates with llama.cpp, then with ggopt, so that a change of load on a
    shared machine hits both alike; stores both sides' minimum and median seconds (prompt
    included), CPU seconds, and the ratios of llama.cpp's time to ggopt's (above 1: ggopt is
    faster; goal 0.7)."""
    llm = _cpp(len(PROMPT) + N_GEN + 1)
    llm.n_threads = ggopt.get_n_threads()
    gen = _generator(f32_model)
    times: dict[str, list[tuple[float, float]]] = {"ggopt": [], "llama_cpp": []}

    def timed(impl: str, fn) -> list[int]:
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times[impl].append((time.perf_counter() - t0, time.process_time() - c0))
        return out

    same: list[bool] = []

    def one_round() -> None:
        theirs = timed("llama_cpp", lambda: _greedy_cpp(llm))
        same.append(timed("ggopt", lambda: _greedy_ggopt(gen)) == theirs)

    benchmark.pedantic(one_round, rounds=5, warmup_rounds=1)
    assert all(same)  # greedy: the same tokens in every round
    wall = {k: np.array([w for w, _ in _after_warm_up(v)]) for k, v in times.items()}
    cpu = {k: np.array([c for _, c in _after_warm_up(v)]) for k, v in times.items()}
    for impl in times:
        benchmark.extra_info[f"{impl}_min_s"] = round(float(wall[impl].min()), 3)
        benchmark.extra_info[f"{impl}_median_s"] = round(float(np.median(wall[impl])), 3)
        benchmark.extra_info[f"{impl}_cpu_min_s"] = round(float(cpu[impl].min()), 3)
    benchmark.extra_info["min_ratio_vs_llama_cpp"] = round(
        float(wall["llama_cpp"].min() / wall["ggopt"].min()), 3)
    benchmark.extra_info["median_ratio_vs_llama_cpp"] = round(
        float(np.median(wall["llama_cpp"] / wall["ggopt"])), 3)


@pytest.mark.benchmark(group=f"eval 2 windows of {EVAL_CTX}, SmolLM2 F32")
@pytest.mark.parametrize("impl", ["llama_cpp", "ggopt"])
def test_eval(benchmark, ratio_to, impl, f32_model):
    ids = (np.arange(2 * EVAL_CTX) * 7919 % 49152).astype(np.int32)
    if impl == "llama_cpp":
        llm = _cpp(EVAL_CTX)
        llm.n_threads = ggopt.get_n_threads()

        def run() -> float:
            return llama_cpp_perplexity(llm, ids.tolist(), EVAL_CTX)
    else:
        def run() -> float:
            return perplexity(f32_model, ids, EVAL_CTX).ppl

    ppl = benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    assert_same_output("eval", impl, float(ppl))
    benchmark.extra_info["tokens_per_second"] = round(
        2 * EVAL_CTX / benchmark.stats.stats.median, 1) if benchmark.stats else None
    ratio_to(impl, llama_cpp=None)


@pytest.mark.benchmark(group=f"generate {N_GEN} tokens, SmolLM2 Q4_1 kept, alternating rounds")
def test_generate_q4_1_kept_alternating(benchmark):
    """The shipped Q4_1 file kept (``base_type="keep"``: ggml's integer products in ggml's
    float order) against llama.cpp on the same file, alternating rounds as
    test_generate_alternating; stores both sides' minimum seconds and the ratios of llama.cpp's
    time to ggopt's (above 1: ggopt is faster). The greedy tokens may differ: the one-token
    steps add the new token's attention terms in another place (docs/ggml-order.md)."""
    path = q4_1_path()
    kept = llama.load(path, progress=False, base_type="keep")
    llm = llama_cpp_model(path, len(PROMPT) + N_GEN + 1)
    llm.set_cache(None)
    llm.n_threads = ggopt.get_n_threads()
    gen = _generator(kept)
    outputs = _alternate(benchmark, lambda: _greedy_cpp(llm), lambda: _greedy_ggopt(gen))
    assert all(len(out) == N_GEN for out in outputs)


@pytest.mark.benchmark(group=f"eval 2 windows of {EVAL_CTX}, SmolLM2 Q4_1 kept, alternating rounds")
def test_eval_q4_1_kept_alternating(benchmark):
    """Perplexity of the shipped Q4_1 file kept against llama.cpp's on the same file, in
    alternating rounds (both sides' minima and llama.cpp's time over ggopt's: above 1, ggopt is
    faster); in ggml's float order the two perplexities are equal (docs/ggml-order.md)."""
    assert_equal_perplexity_alternating(benchmark, q4_1_path())


@pytest.mark.benchmark(group=f"eval 2 windows of {EVAL_CTX}, SmolLM2 Q4_K_M kept, alternating")
def test_eval_q4_k_m_kept_alternating(benchmark):
    """The same on the Q4_K_M file of llama.cpp's quantizer (Q4_K and Q6_K products in the
    order of ggml's tiled K-quant matmul, Q5_0 and Q8_0 in its vec_dot's)."""
    assert_equal_perplexity_alternating(benchmark, quantized_path("Q4_K_M"))


def assert_equal_perplexity_alternating(benchmark, path: Path) -> None:
    """The file kept (ggml's float order) against llama.cpp, alternating rounds: the same
    perplexity on both sides and in every round."""
    kept = llama.load(path, progress=False, base_type="keep")
    llm = llama_cpp_model(path, EVAL_CTX)
    llm.n_threads = ggopt.get_n_threads()
    ids = (np.arange(2 * EVAL_CTX) * 7919 % 49152).astype(np.int32)
    results = _alternate(benchmark, lambda: llama_cpp_perplexity(llm, ids.tolist(), EVAL_CTX),
                         lambda: perplexity(kept, ids, EVAL_CTX).ppl)
    theirs, ours = results[0], results[1]
    assert len(set(results[0::2])) == len(set(results[1::2])) == 1  # the same in every round
    assert ours == theirs
    benchmark.extra_info["ppl_ggopt"], benchmark.extra_info["ppl_llama_cpp"] = ours, theirs


def _alternate(benchmark, cpp, ours) -> list:
    """llama.cpp then ggopt, 5 rounds after a warm-up (left out of the times); both sides'
    minimum seconds and the ratios of llama.cpp's time to ggopt's in ``extra_info``; returns
    the outputs in call order (llama.cpp's, ggopt's, llama.cpp's, ...)."""
    wall: dict[str, list[float]] = {"ggopt": [], "llama_cpp": []}
    outputs: list = []

    def one_round() -> None:
        for impl, fn in (("llama_cpp", cpp), ("ggopt", ours)):
            t0 = time.perf_counter()
            outputs.append(fn())
            wall[impl].append(time.perf_counter() - t0)

    benchmark.pedantic(one_round, rounds=5, warmup_rounds=1)
    ours_s = np.array(_after_warm_up(wall["ggopt"]))
    theirs_s = np.array(_after_warm_up(wall["llama_cpp"]))
    benchmark.extra_info["ggopt_min_s"] = round(float(ours_s.min()), 4)
    benchmark.extra_info["llama_cpp_min_s"] = round(float(theirs_s.min()), 4)
    benchmark.extra_info["min_ratio_vs_llama_cpp"] = round(float(theirs_s.min() / ours_s.min()), 3)
    benchmark.extra_info["median_ratio_vs_llama_cpp"] = round(
        float(np.median(theirs_s / ours_s)), 3)
    return outputs
