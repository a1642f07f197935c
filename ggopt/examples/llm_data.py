"""Byte-level text data for the llama example: the corpus, tokens, and llama.cpp's dataset.

Tokens are the bytes of the text (vocabulary 256), so any file works, UTF-8 or not. The
dataset is built as llama.cpp's ``common_opt_dataset_init``: datapoint ``i`` is the window
``tokens[i*stride : i*stride + n_ctx]`` and its labels the same window shifted by one token.
"""

from __future__ import annotations

import math
import os
import sysconfig
from collections.abc import Sequence

import numpy as np

from .. import I32
from ..errors import ShapeError
from ..opt import Dataset

__all__ = ["DEFAULT_MODULES", "default_corpus_paths", "read_corpus", "tokenize", "detokenize",
           "unigram_entropy_bits", "make_dataset"]

#: The default corpus: these modules of the running Python's standard library, in this order
#: (read from ``sysconfig.get_paths()["stdlib"]``; about 470 KB of Python source).
DEFAULT_MODULES = (
    "argparse.py", "dataclasses.py", "functools.py", "textwrap.py", "heapq.py", "fractions.py",
    "statistics.py", "shlex.py", "pprint.py", "csv.py", "calendar.py", "base64.py",
    "random.py", "json/decoder.py", "json/encoder.py", "contextlib.py",
)


def default_corpus_paths() -> list[str]:
    """Paths of :data:`DEFAULT_MODULES` that exist in this Python's standard library."""
    stdlib = sysconfig.get_paths()["stdlib"]
    paths = [os.path.join(stdlib, m) for m in DEFAULT_MODULES]
    found = [p for p in paths if os.path.isfile(p)]
    if not found:
        raise ShapeError(f"default corpus: none of the modules {', '.join(DEFAULT_MODULES)} "
                         f"is in the standard library at {stdlib!r}; pass --text FILE")
    return found


def read_corpus(paths: Sequence[str | os.PathLike[str]]) -> bytes:
    """The bytes of ``paths`` concatenated (OSError for an unreadable file)."""
    chunks = []
    for path in paths:
        with open(path, "rb") as f:
            chunks.append(f.read())
    return b"".join(chunks)


def tokenize(text: bytes | str) -> np.ndarray:
    """Token ids (int32) of ``text``: its bytes (a str is encoded as UTF-8)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    return np.frombuffer(text, dtype=np.uint8).astype(np.int32)


def detokenize(tokens: Sequence[int] | np.ndarray) -> bytes:
    """The bytes of token ids."""
    return np.asarray(tokens, dtype=np.uint8).tobytes()


def unigram_entropy_bits(tokens: np.ndarray) -> float:
    """Entropy of the byte frequencies of ``tokens``, in bits per byte."""
    counts = np.bincount(tokens, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum()) if p.size else math.nan


def make_dataset(tokens: np.ndarray, n_ctx: int, stride: int, where: str = "dataset") -> Dataset:
    """``Dataset(I32, I32, n_ctx, n_ctx, ndata, 1)`` with ``ndata = (ntok-n_ctx-1)//stride``.

    Raises
    ------
    ShapeError
        Fewer tokens than one window needs (``n_ctx + 1 + stride``).
    """
    ntok = len(tokens)
    if stride < 1:
        raise ShapeError(f"{where}: stride must be >= 1, got {stride}")
    ndata = (ntok - n_ctx - 1) // stride
    if ndata < 1:
        raise ShapeError(f"{where}: {ntok} tokens (bytes) are too few for windows of n_ctx="
                         f"{n_ctx} with stride {stride}: expected at least "
                         f"{n_ctx + 1 + stride}")
    ds = Dataset(I32, I32, n_ctx, n_ctx, ndata, 1)
    starts = np.arange(ndata, dtype=np.int64)[:, None] * stride + np.arange(n_ctx)[None, :]
    tok = np.asarray(tokens, dtype=np.int32)
    labels = ds.labels
    assert labels is not None  # a dataset with ne_label > 0
    ds.data.numpy()[...] = tok[starts]
    labels.numpy()[...] = tok[starts + 1]
    return ds
