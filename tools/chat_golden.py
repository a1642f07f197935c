"""Record the chat-template golden file ``tests/data/chat_golden.json``: for every template in
llama.cpp's ``models/templates`` (and SmolLM2's own), the SHA-256 of the rendering of a few
conversations (with and without the generation prompt) and of the SmolLM2 tokenizer's chat
masks (:func:`ggopt.lm.chat.conversation_ids`). Generated once from main at a05a442 (each prefix
rendered in process) on 2026-12-04; the tests check that today's renderer reproduces it byte
for byte, with ``strftime_now`` pinned to that day (``SOURCE_DATE_EPOCH = GOLDEN_EPOCH``: some
templates print the date).

Usage: ``SOURCE_DATE_EPOCH=1796364000 python tools/chat_golden.py TEMPLATE_DIR SMOLLM2.gguf
OUT.json``
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

#: 2026-12-04 06:00 UTC, the day the golden file was recorded (templates that print the date)
GOLDEN_EPOCH = 1796364000
SYSTEM = {"role": "system", "content": "Be brief."}
CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "chat": [SYSTEM, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    "turns": [SYSTEM, {"role": "user", "content": "Hi there"},
              {"role": "assistant", "content": "  Hello! How can I help?\n"},
              {"role": "user", "content": "What is 2+2?"},
              {"role": "assistant", "content": "4. Ünïcödé: 日本語 ✓"},
              {"role": "user", "content": "Thanks"},
              {"role": "assistant", "content": "You're welcome."}],
    "nosystem": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                 {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}],
    "long": [m for i in range(20) for m in (
        {"role": "user", "content": f"question {i}?"},
        {"role": "assistant", "content": f"answer {i}, {'x' * (i % 7)}."})],
}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()


def _outcome(fn: Any) -> str:
    try:
        return _digest(fn())
    except ValueError as exc:  # a GgoptError: the template refuses this conversation
        return f"error {type(exc).__name__}"


def golden(template_dir: Path, smollm2: Path) -> dict[str, dict[str, str]]:
    import ggopt.tokenizers as tk
    from ggopt.lm.chat import conversation_ids

    tok = tk.load(smollm2)
    templates = {p.stem: p.read_text() for p in sorted(template_dir.glob("*.jinja"))}
    templates["SmolLM2-own"] = tok.chat_template or ""
    out: dict[str, dict[str, str]] = {}
    for name, text in templates.items():
        entry: dict[str, str] = {}
        for cname, msgs in CONVERSATIONS.items():
            for gen in (False, True):
                entry[f"{cname} gen={gen}"] = _outcome(lambda t=text, m=msgs, g=gen: tk.render_chat(
                    t, m, add_generation_prompt=g, bos_token="<s>", eos_token="</s>"))
            entry[f"{cname} masks"] = _outcome(lambda t=text, m=msgs: conversation_ids(
                _with_template(tok, t), m))
        out[name] = entry
    return out


def _with_template(tok: Any, text: str) -> Any:
    import copy
    import dataclasses

    clone = copy.copy(tok)
    clone.vocab = dataclasses.replace(tok.vocab, chat_template=text)
    return clone


if __name__ == "__main__":
    result = golden(Path(sys.argv[1]), Path(sys.argv[2]))
    Path(sys.argv[3]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
