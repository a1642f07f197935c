"""``ggopt train`` under ``mpiexec -n 2`` (``--dist``): the same weights as one process."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt.cli import llm
from ggopt.models.llama import byte_gguf
from tests.support.mpi import MPIEXEC, run

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="MPI is not installed")

ARGS = ["--ctx", "16", "--embd", "32", "--layers", "1", "--heads", "2", "--ff", "48",
        "--batch", "4"]


def test_llm_two_ranks_equal_one_process(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(llm.read_corpus(llm.default_corpus_paths()[:1])[:8000])
    paths = {}
    for n, extra in ((1, ["--ubatch", "2"]), (2, [])):  # 2 ranks: micro-batches of 4/2
        paths[n] = tmp_path / f"m{n}.gguf"
        code, out = run(n, "-m", "ggopt", "train", "--text", str(text), "--out",
                        str(paths[n]), *ARGS, *extra)
        assert code == 0, out
        assert "epoch 1:" in out
    one, two = byte_gguf.load(paths[1])[1], byte_gguf.load(paths[2])[1]
    for name in one:
        np.testing.assert_array_equal(one[name], two[name], err_msg=name)
