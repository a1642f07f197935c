"""The fast GGUF header reader (issue 34, item 5): the same keys, array lengths and tensor
list as gguf.GGUFReader, either byte order, without decoding the arrays; bad files as
ShapeError."""

from __future__ import annotations

import pytest
from gguf import GGUFReader, GGUFValueType

from ggopt.errors import ShapeError
from ggopt.io.gguf_header import read_header
from ggopt.models import llama
from tests.support.llama_files import Q, write

CFG = llama.Config(n_ctx=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64)


@pytest.mark.parametrize("big_endian", [False, True])
def test_header_matches_gguf_reader(tmp_path, big_endian):
    path = tmp_path / "m.gguf"
    write(path, CFG, types={"blk.0.attn_q.weight": Q.Q8_0}, big_endian=big_endian)
    scalars, lengths, tensors = read_header(path, "m")
    r = GGUFReader(path)
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            assert lengths[key] == len(field.data), key
        else:
            assert scalars[key] == pytest.approx(field.contents()), key
    assert {t.name: (tuple(int(d) for d in t.shape), int(t.tensor_type)) for t in r.tensors} \
        == tensors
    assert lengths["tokenizer.ggml.tokens"] == 256


def test_bad_files_are_shape_errors(tmp_path):
    path = tmp_path / "m.gguf"
    write(path, CFG)
    data = path.read_bytes()
    for name, content in (("trunc", data[:200]), ("junk", b"hello"), ("empty", b"")):
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(content)
        with pytest.raises(ShapeError, match="not a readable GGUF file"):
            read_header(bad, "m")
    with pytest.raises(ShapeError, match="no such file"):
        read_header(tmp_path / "none.gguf", "m")


@pytest.mark.model
def test_smollm2_header_gives_what_the_loader_reads():
    """The fine-tune's checks before the load read SmolLM2's sizes from the header alone."""
    from ggopt.lm import preflight
    from ggopt.models.llama.weights import open_reader
    from tools.smollm import q4_1_path

    path = q4_1_path()
    info = preflight.model_info(path)
    cfg, table = llama.read_config(open_reader(str(path), "smollm2"), "smollm2")
    assert (info.n_ctx, info.n_embd, info.n_layer, info.n_head, info.n_ff, info.n_vocab) == \
        (cfg.n_ctx, cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_ff, cfg.n_vocab)
    assert info.shapes == {n: tuple(int(d) for d in t.shape) for n, t in table.items()}
    assert info.file_type == "MOSTLY_Q4_1" and info.quantized
    assert preflight.check_lora(info, 8, "attn_k") == ("attn_k",)
    with pytest.raises(Exception, match="above attn_k's smaller side"):
        preflight.check_lora(info, 193, "attn_k")
