"""The sweep of issue 32 over what this round's fine-tune reads: a LoRA adapter made for
another architecture, and a chat set too large for the machine's memory. Each is a GgoptError
naming the cause before anything is made."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter

import ggopt.tokenizers as tk
from ggopt.errors import InvalidValueError, OutOfMemoryError
from ggopt.lm import chat, lora
from ggopt.models import llama
from tests.support.families import FAMILIES, write_family
from tests.support.finetune import CFG, tiny
from tests.support.tokenizer_files import BYTE_TOKENS


def _adapter(path: Path, arch: str, cfg: llama.Config) -> Path:
    """A well-formed adapter of ``cfg``'s shapes that says it is for ``arch``."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), arch)
    w.add_key_value("general.type", "adapter", GGUFValueType.STRING)
    w.add_key_value("adapter.type", "lora", GGUFValueType.STRING)
    w.add_key_value("adapter.lora.alpha", 8.0, GGUFValueType.FLOAT32)
    n_out, n_in = llama.param_shapes(cfg)["blk.0.attn_q.weight"]
    w.add_tensor("blk.0.attn_q.weight.lora_a", rng.standard_normal((2, n_in)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight.lora_b", rng.standard_normal((n_out, 2)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "mistral"])
def test_an_adapter_of_another_architecture_is_refused_by_name(tmp_path, arch):
    """Shapes that fit are not enough: llama.cpp refuses an adapter whose
    general.architecture differs from the model's, and so does ggopt, naming both."""
    net = tiny()
    with pytest.raises(InvalidValueError, match=f"general.architecture is '{arch}', expected "
                                                f"'llama'"):
        lora.load(_adapter(tmp_path / "a.gguf", arch, CFG), net)


def test_a_llama_adapter_is_refused_on_a_qwen2_base(tmp_path):
    base = tmp_path / "qwen2.gguf"
    write_family(base, "qwen2")
    net = llama.load(base, progress=False).net
    with pytest.raises(InvalidValueError, match="is 'llama', expected 'qwen2'"):
        lora.load(_adapter(tmp_path / "a.gguf", "llama", FAMILIES["qwen2"]), net)


def _byte_chat_tokenizer() -> tk.Tokenizer:
    path = Path(tempfile.mkdtemp()) / "byte-chat.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", "rwkv")
    w.add_array("tokenizer.ggml.tokens", BYTE_TOKENS)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m['role'] + ': ' + "
                 "m['content'] + '\\n' }}{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return tk.load(path)


def test_chat_windows_beyond_the_available_memory_are_refused(monkeypatch):
    """A chat set of 10^6 rows at a large --ctx needs more memory for its windows than the
    machine has (10^6 x 2048 tokens: 16 GB); np.full filled them page by page until the
    machine ran out. The need is now checked against the memory available first."""
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    monkeypatch.setattr(chat, "available_bytes", lambda: 4 * 16 * 64 - 1)
    with pytest.raises(OutOfMemoryError, match="no memory for 4 windows of 64 tokens: they need"):
        chat.chat_windows(_byte_chat_tokenizer(), [conv] * 4, 64)
    monkeypatch.setattr(chat, "available_bytes", lambda: 4 * 16 * 64)
    assert chat.chat_windows(_byte_chat_tokenizer(), [conv] * 4, 64).tokens.shape == (4, 64)
