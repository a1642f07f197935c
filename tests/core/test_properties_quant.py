"""Property tests of the quantized types: ggopt's quantizer is ggml's reference bit for bit on
any float32 rows, quantize -> dequantize -> quantize is stable (the blocks come back the same),
and dequantize(blocks) equals gguf's for any block bytes (the K-quants too); GGUF files keep
quantized tensors byte for byte.

The number of examples comes from the hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from gguf import quants as gq  # noqa: E402
from gguf.constants import GGMLQuantizationType as GQT  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from ggopt import quants  # noqa: E402
from ggopt.io import gguf as ggio  # noqa: E402
from ggopt.types import GGType  # noqa: E402
from tools.kquants import K_TYPES, SCALE_AT  # noqa: E402

# gguf's NumPy quantizer warns on the blocks whose scale's reciprocal overflows (tiny values);
# ggml's C computes the same codes silently, and so does ggopt
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

TYPES = st.sampled_from([GGType.Q4_0, GGType.Q4_1, GGType.Q5_0, GGType.Q5_1, GGType.Q8_0])


@st.composite
def rows(draw) -> np.ndarray:
    """Float32 rows of 1-3 blocks: finite values of any magnitude, with repeats and zeros."""
    n_rows = draw(st.integers(1, 4))
    n_blocks = draw(st.integers(1, 3))
    scale = draw(st.sampled_from([1e-6, 1e-2, 1.0, 1e3, 6e4]))
    elems = st.floats(-1.0, 1.0, width=32, allow_subnormal=False) | st.sampled_from([0.0, 1.0])
    x = draw(hnp.arrays(np.float32, (n_rows, 32 * n_blocks), elements=elems))
    return (x * np.float32(scale)).astype(np.float32)


@given(x=rows(), qtype=TYPES)
def test_quantize_is_the_reference_and_requantizing_is_stable(x, qtype):
    blocks = quants.quantize(x, qtype, n_threads=2)
    np.testing.assert_array_equal(blocks, gq.quantize(x, GQT(int(qtype))))
    values = quants.dequantize(blocks, qtype)
    again = quants.dequantize(quants.quantize(values, qtype), qtype)
    np.testing.assert_array_equal(again, values)


@given(qtype=TYPES, data=st.data())
def test_dequantize_any_block_bytes_as_gguf(qtype, data):
    n = data.draw(st.integers(1, 6))
    raw = data.draw(hnp.arrays(np.uint8, (n, qtype.size)))
    raw[:, 1] &= 0xFB  # finite F16 scales (exponent below 31): NaN payloads are not compared
    if qtype in (GGType.Q4_1, GGType.Q5_1):
        raw[:, 3] &= 0xFB
    got = quants.dequantize(raw, qtype, n_threads=2)
    want = gq.dequantize(raw, GQT(int(qtype)))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@given(qtype=st.sampled_from(K_TYPES), data=st.data())
def test_dequantize_any_k_quant_bytes_as_gguf(qtype, data):
    n = data.draw(st.integers(1, 4))
    raw = data.draw(hnp.arrays(np.uint8, (n, qtype.size)))
    for at in SCALE_AT[qtype]:
        raw[:, at + 1] &= 0xFB  # finite F16 super-block scales
    got = quants.dequantize(raw, qtype, n_threads=2)
    want = gq.dequantize(raw, GQT(int(qtype)))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@hypothesis.settings(max_examples=10, deadline=None)
@given(x=rows(), qtype=TYPES)
def test_gguf_files_keep_quantized_tensors_byte_for_byte(tmp_path_factory, x, qtype):
    path = tmp_path_factory.mktemp("q") / "q.gguf"
    blocks = quants.Blocks(qtype, quants.quantize(x, qtype))
    ggio.save(path, {"w": blocks, "n": np.arange(3, dtype=np.float32)},
              {"general.architecture": "test"})
    _, tensors = ggio.load_blocks(path)
    got = tensors["w"]
    assert isinstance(got, quants.Blocks) and got.type is qtype
    assert got.shape == x.shape
    np.testing.assert_array_equal(got.data, blocks.data)
