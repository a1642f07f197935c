"""SmolLM2-135M-Instruct (the real pretrained model, marker ``model``) against llama.cpp's
numbers stored in tests/data/smollm2_reference.json (written by tools/llama_reference.py with
llama-cpp-python 0.3.36, F32 KV cache, flash attention off; no llama.cpp needed here).

ggopt dequantizes the Q4_1 file to F32, so its logits are those of llama.cpp on the F32 copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggopt.lm import SamplingParams, generate, perplexity
from ggopt.models import llama
from tools.smollm import q4_1_path

pytestmark = pytest.mark.model

REF = json.loads((Path(__file__).parents[1] / "data" / "smollm2_reference.json").read_text())


@pytest.fixture(scope="module")
def smollm():
    return llama.load(q4_1_path(), progress=False)


def test_config_is_smollm2(smollm):
    cfg = smollm.cfg
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.n_ff, cfg.n_vocab) == \
        (30, 576, 9, 3, 1536, 49152)
    assert cfg.freq_base == 1e5 and cfg.eps == 1e-5 and cfg.tied_output and cfg.n_ctx == 8192
    assert smollm.tensor_types == {"Q8_0": 1, "Q4_1": 210, "F32": 61}


def test_logits_equal_llama_cpp_f32(smollm):
    ids = REF["gpl3_tokens_1024"][:128]
    z = llama.logits(smollm, ids)
    worst = 0.0
    for pos, row in REF["f32_logits_128"].items():
        got = z[int(pos), row["ids"]]
        worst = max(worst, float(np.abs(got - np.asarray(row["logits"])).max()))
        assert list(np.argsort(-z[int(pos)])[:5]) == row["ids"][:5]
    assert worst < 1e-3, worst


def test_greedy_generation_equals_llama_cpp(smollm):
    r = generate(smollm, REF["gpl3_tokens_1024"][:128], 32, SamplingParams(temp=0))
    assert r.tokens == REF["f32_greedy_32"]


def test_perplexity_within_half_a_percent_of_llama_cpp(smollm):
    r = perplexity(smollm, REF["gpl3_tokens_1024"], 128)
    want = REF["f32_ppl_1024_ctx128"]
    assert abs(r.ppl / want - 1) < 0.005, (r.ppl, want)


def test_cli_tokenize_eval_generate_chat(tmp_path, capsys):
    from ggopt.cli import llm
    from tools.smollm import GPL3

    path = str(q4_1_path())
    assert llm.main(["tokenize", "--model", path, "--text", str(GPL3)]) == 0
    ids = eval(capsys.readouterr().out)  # a Python list, as llama-tokenize --ids
    assert len(ids) == REF["gpl3_n_tokens"] and ids[:1024] == REF["gpl3_tokens_1024"]
    assert llm.main(["tokenize", "--model", path, "--prompt", "<|im_start|>hi",
                     "--parse-special"]) == 0
    assert eval(capsys.readouterr().out)[0] == 1
    text = tmp_path / "gpl.txt"
    text.write_bytes(GPL3.read_bytes()[:6000])
    assert llm.main(["eval", "--model", path, "--text", str(text), "--ctx", "128"]) == 0
    assert "perplexity: " in capsys.readouterr().out
    assert llm.main(["generate", "--model", path, "--chat", "--prompt", "What is 2+2?",
                     "-n", "12", "--temp", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<|im_start|>system\n") and "<|im_start|>assistant\n" in out
