"""Write tests/data/smollm2_reference.json: llama.cpp's numbers for SmolLM2-135M-Instruct, the
reference of tests/models/test_smollm.py (marker ``model``), which runs without llama.cpp.

Needs llama-cpp-python and the model in ``GGOPT_CACHE`` (``~/.cache/ggopt``); writes the F32
copy beside the Q4_1 file (``ggopt.models.llama.write_f32``). llama.cpp runs with an F32 KV
cache and flash attention off. Stored: GPL-3's first 1024 token ids (llama.cpp's tokenizer,
``add_special`` as llama-perplexity), llama.cpp's logits for the first 128 tokens at a few
positions (the 32 largest of each row), its greedy continuation of 32 tokens, and
llama-perplexity's perplexity of the 1024 tokens at ctx 128 and of all of GPL-3 at ctx 256, for
the F32 copy and the Q4_1 file. Run: ``python tools/llama_reference.py``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.smollm import (  # noqa: E402
    GPL3,
    f32_path,
    llama_cpp_model,
    llama_cpp_perplexity,
    q4_1_path,
)

OUT = ROOT / "tests" / "data" / "smollm2_reference.json"
POSITIONS = [0, 31, 63, 127]
TOP = 32
N_GREEDY = 32


def _greedy(llm, prompt: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def main() -> None:
    text = GPL3.read_bytes()
    ref: dict[str, object] = {
        "q4_1_sha256": hashlib.sha256(q4_1_path().read_bytes()).hexdigest(),
        "llama_cpp": __import__("llama_cpp").__version__,
        "positions": POSITIONS,
    }
    for kind, path in (("f32", f32_path()), ("q4_1", q4_1_path())):
        llm = llama_cpp_model(path, 256)
        ids = llm.tokenize(text, add_bos=True, special=False)
        if kind == "f32":
            ref["gpl3_n_tokens"] = len(ids)
            ref["gpl3_tokens_1024"] = ids[:1024]
        llm.reset()
        llm.eval(ids[:128])
        rows = {}
        for pos in POSITIONS:
            z = np.asarray(llm.scores[pos], np.float32)
            top = np.argsort(-z)[:TOP]
            rows[str(pos)] = {"ids": top.tolist(), "logits": [float(z[i]) for i in top]}
        ref[f"{kind}_logits_128"] = rows
        ref[f"{kind}_greedy_32"] = _greedy(llm, ids[:128], N_GREEDY)
        ref[f"{kind}_ppl_gpl3_ctx256"] = llama_cpp_perplexity(llm, ids, 256)
        small = llama_cpp_model(path, 128)
        ref[f"{kind}_ppl_1024_ctx128"] = llama_cpp_perplexity(small, ids[:1024], 128)
        print(kind, {k: v for k, v in ref.items() if k.startswith(kind) and "ppl" in k})
    OUT.write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
