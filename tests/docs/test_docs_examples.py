"""The Python examples of the docs run as written: every ``python`` block that a
``<!-- docs-test: run -->`` line precedes, in order, in one namespace (issue 33)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ggopt import backend as gb
from ggopt.models import llama
from tests.support.llama_files import write

DOCS = Path(__file__).resolve().parents[2] / "docs"
_BLOCK = re.compile(r"^<!-- docs-test: (\w+)[^>]*-->\n```python\n(.*?)^```", re.M | re.S)
CHATML = ("{% for m in messages %}{{ '<s>' + m['role'] + '\n' + m['content'] + '</s>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}")
QUESTIONS = ["What color is snow?", "What is 1 plus 1?", "Which animal meows?", "Name a fruit.",
             "Where is Paris?", "How many legs has a cat?", "Is ice cold?", "What is blue?",
             "Who wrote Hamlet?", "What is rain?", "Name a colour.", "Count to three."]


def blocks(page: str) -> list[tuple[str, str]]:
    """``(kind, code)`` of the page's marked python blocks, in order."""
    return _BLOCK.findall((DOCS / page).read_text(encoding="utf-8"))


def test_the_marked_blocks_are_found():
    kinds = [k for k, _ in blocks("fine-tuning.md")]
    assert kinds[0] == "setup" and kinds.count("run") == 3


def test_fine_tuning_python_example(tmp_path, capsys):
    """Load, LoRA, chat data, fit, save the adapter and the merged GGUF, generate: the docs'
    code on a tiny byte-vocabulary llama with a chat template."""
    model = tmp_path / "tiny-chat.gguf"
    cfg = llama.Config(n_ctx=256, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64)
    write(model, cfg, key_overrides={"tokenizer.chat_template": (CHATML, GGUFValueType.STRING)})
    chat = tmp_path / "conversations.jsonl"
    chat.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": "OK. -- SmolBot"}]}) + "\n"
        for q in QUESTIONS))
    ns = {"MODEL": str(model), "CHAT": str(chat), "ADAPTER": str(tmp_path / "adapter.gguf"),
          "MERGED": str(tmp_path / "tuned.gguf")}
    setup = [code for kind, code in blocks("fine-tuning.md") if kind == "setup"]
    assert all(re.search(rf"\b{name}\b", setup[0]) for name in ns)  # the names it stands for
    for kind, code in blocks("fine-tuning.md"):
        if kind == "run":
            exec(compile(code, "docs/fine-tuning.md", "exec"), ns)  # noqa: S102
    out = capsys.readouterr().out
    assert "tokens/s" in out and "merged model:" in out
    # the adapter trained: the held-out loss fell below the base's
    assert ns["history"].val_loss[-1] < ns["before"].loss
    adapter = GGUFReader(ns["ADAPTER"])
    assert len(adapter.tensors) == 2 * 7 * cfg.n_layer  # lora_a and lora_b of seven projections
    _, merged, _ = llama.read_weights(ns["MERGED"])
    assert set(merged) == set(llama.param_shapes(cfg))
    assert ns["answer"].tokens  # the merged model generated


def test_readme_port_example():
    """The README's ported ggml-opt program on 2000 random datapoints for one epoch: the
    weights and the data filled where its comments say, before ``fit``."""
    text = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    (kind, code), = _BLOCK.findall(text)
    assert kind == "run" and "60000" in code and ", 30, 1000," in code
    code = code.replace("60000", "2000").replace(", 30, 1000,", ", 1, 1000,")
    build, fit = code.split("history = ")
    ns: dict = {}
    exec(compile(build, "README.md", "exec"), ns)  # noqa: S102
    rng = np.random.default_rng(0)
    for name in ("w1", "b1", "w2", "b2"):
        w = ns[name]
        gb.tensor_set(w, rng.normal(0, 0.01, gb.tensor_get(w).shape).astype(np.float32))
    ds = ns["ds"]
    gb.tensor_set(ds.data, rng.random((2000, 784), np.float32))
    gb.tensor_set(ds.labels, np.eye(10, dtype=np.float32)[rng.integers(0, 10, 2000)])
    exec(compile("history = " + fit, "README.md", "exec"), ns)  # noqa: S102
    history = ns["history"]
    assert len(history.train_loss) == 1 and 0 < history.train_loss[0] < 10
