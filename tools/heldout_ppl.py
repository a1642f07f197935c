"""Held-out perplexity in llama.cpp of GGUF models (fine-tuned ones and their base), on the
windows that ``ggopt finetune --text FILE --ctx N --val-split F`` holds out.

The text is tokenized by llama.cpp (BOS as the model says, special tokens not parsed, as the
fine-tune does) and cut as the fine-tune cuts it (:func:`ggopt.lm.windows.text_windows`,
:func:`~ggopt.lm.windows.split_point`, batch 1); each held-out window is evaluated from an empty
cache (llama-cpp-python, F32 KV cache, flash attention off) and its ``N`` next-token losses
averaged over all held-out windows: ``ppl_all``, the number ``FineTuner.validate`` prints.
``ppl_clean`` leaves out the positions whose label token the training windows also hold (the
windows overlap by half, so the first held-out window's first half was trained on).

``python tools/heldout_ppl.py MODEL.gguf [MODEL.gguf ...] [--lora ADAPTER.gguf] [--text FILE]
[--ctx 128] [--val-split 0.1] [--threads 2]``: one JSON line per model (with ``--lora``, each
model with that LoRA adapter applied by llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ggopt.lm.windows import split_point, text_windows  # noqa: E402
from tools.smollm import GPL3, llama_cpp_logits, llama_cpp_model  # noqa: E402


def _nll(z: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-row ``-log softmax(z)[label]`` in float64."""
    z = z.astype(np.float64)
    zmax = z.max(-1, keepdims=True)
    lse = np.log(np.exp(z - zmax).sum(-1)) + zmax[:, 0]
    out: np.ndarray = lse - z[np.arange(len(labels)), labels]
    return out


def heldout(path: Path, text: bytes, n_ctx: int, val_split: float, n_threads: int,
            lora: Path | None = None) -> dict[str, float | int]:
    """``ppl_all``/``n_all`` and ``ppl_clean``/``n_clean`` of the model at ``path`` (with the
    adapter ``lora``)."""
    llm = llama_cpp_model(path, n_ctx, n_threads, lora)
    ids = llm.tokenize(text, add_bos=True, special=False)
    win = text_windows(ids, n_ctx)
    stride = n_ctx // 2
    ntrain = split_point(len(win), val_split)
    last_trained = (ntrain - 1) * stride + n_ctx  # the last training window's last label
    all_nll, clean = [], []
    for w in range(ntrain, len(win)):
        nll = _nll(llama_cpp_logits(llm, win.tokens[w].tolist()), win.labels[w])
        all_nll.append(nll)
        clean.append(nll[w * stride + 1 + np.arange(n_ctx) > last_trained])
    a, c = np.concatenate(all_nll), np.concatenate(clean)
    return {"ppl_all": math.exp(a.mean()), "n_all": int(a.size),
            "ppl_clean": math.exp(c.mean()), "n_clean": int(c.size)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path, help="GGUF files")
    ap.add_argument("--lora", type=Path, default=None,
                    help="a LoRA adapter GGUF applied to every model (default: none)")
    ap.add_argument("--text", type=Path, default=GPL3, help="the fine-tune's text (GPL-3)")
    ap.add_argument("--ctx", type=int, default=128, help="the fine-tune's --ctx (128)")
    ap.add_argument("--val-split", type=float, default=0.1,
                    help="the fine-tune's --val-split (0.1)")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (2)")
    args = ap.parse_args()
    text = args.text.read_bytes()
    for path in args.models:
        res = heldout(path, text, args.ctx, args.val_split, args.threads, args.lora)
        lora = {} if args.lora is None else {"lora": str(args.lora)}
        print(json.dumps({"model": str(path), **lora, **res}), flush=True)


if __name__ == "__main__":
    main()
