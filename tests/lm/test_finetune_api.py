"""The Python fine-tune API (issue 33's API item, issue 34's item 9): the example of
docs/fine-tune-api.md runs as written on a tiny llama and does what it says."""

from __future__ import annotations

import json
import math
import pathlib
import re

import numpy as np
import pytest

from ggopt.lm import FineTune, lora
from ggopt.models import llama
from tests.support.llama_files import write

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "fine-tune-api.md"
CFG = llama.Config(n_ctx=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64)
TEXT = ("GNU GENERAL PUBLIC LICENSE. Everyone is permitted to copy and distribute verbatim "
        "copies of this license document, but changing it is not allowed. ") * 12


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "base.gguf", CFG)
    (tmp_path / "train.txt").write_text(TEXT)
    namespace: dict[str, object] = {}
    exec(compile(_example(), str(DOC), "exec"), namespace)  # noqa: S102 - the docs' own code
    out = capsys.readouterr().out
    ft = namespace["ft"]
    assert isinstance(ft, FineTune)
    m = re.search(r"val loss ([0-9.]+) -> best ([0-9.]+) at step (\d+)", out)
    assert m is not None, out
    assert float(m.group(2)) < float(m.group(1))  # it learned
    assert "ALL_F32 | " in out
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0
    assert any(r.get("val_loss") is not None and r["step"] == 10 for r in records)
    # the merged model is the base with the adapter, and generates the same greedy text
    net = llama.load(tmp_path / "base.gguf", progress=False).net
    adapter = lora.load(tmp_path / "adapter.gguf", net)
    want = lora.merged(llama.get_weights(net), adapter)
    _, got, _ = llama.read_weights(tmp_path / "merged.gguf")
    np.testing.assert_array_equal(got["blk.1.ffn_up.weight"], want["blk.1.ffn_up.weight"])
    merged = FineTune(tmp_path / "merged.gguf", progress=False)
    assert merged.generate("Everyone is", n=12) == ft.generate("Everyone is", n=12)


def test_bad_calls(tmp_path):
    write(tmp_path / "base.gguf", CFG)
    ft = FineTune(tmp_path / "base.gguf", progress=False)
    with pytest.raises(Exception, match="call data"):
        ft.fit()
    with pytest.raises(Exception, match="text files or a chat file"):
        ft.data()
    with pytest.raises(Exception, match="has no adapter"):
        ft.save_adapter(tmp_path / "a.gguf")
    with pytest.raises(Exception, match="rank must be an int >= 1"):
        FineTune(tmp_path / "base.gguf", lora_rank=0, progress=False)
    assert math.isnan(ft.val_before)
    # one text file given alone, not in a list (it raised a raw TypeError)
    text = tmp_path / "t.txt"
    text.write_text("abc " * 200)
    assert ft.data(text, ctx=16).n_ctx == 16 and ft.data(str(text), ctx=16).n_ctx == 16
