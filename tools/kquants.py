"""Raw K-quant super-blocks (Q2_K ... Q6_K) for tests and benches: ggopt (like the gguf
package) has no quantizer for them, so they build valid blocks from random bytes with finite,
moderate F16 scales (``d``, and ``dmin`` where the type has one), and compare with
``gguf.quants.dequantize``."""

from __future__ import annotations

import numpy as np
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as GQT

from ggopt.types import GGType

K_TYPES = [GGType.Q2_K, GGType.Q3_K, GGType.Q4_K, GGType.Q5_K, GGType.Q6_K]
#: byte offsets of the F16 super-block scales in each type's block
SCALE_AT = {GGType.Q2_K: (80, 82), GGType.Q3_K: (108,), GGType.Q4_K: (0, 2),
            GGType.Q5_K: (0, 2), GGType.Q6_K: (208,)}


def k_blocks(qtype: GGType, rows: int, cols: int, seed: int = 0,
             scale: float = 2e-3) -> np.ndarray:
    """``(rows, row bytes)`` uint8: random super-blocks of ``cols`` (a multiple of 256)
    elements per row, F16 scales in ``[scale/2, scale]`` (values of order ``60 * scale``)."""
    rng = np.random.default_rng(seed)
    nb = cols // 256
    raw = rng.integers(0, 256, (rows, nb, qtype.size), dtype=np.uint8)
    for off in SCALE_AT[qtype]:
        d = rng.uniform(scale / 2, scale, (rows, nb)).astype(np.float16)
        raw[..., off:off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * qtype.size)


def gguf_values(raw: np.ndarray, qtype: GGType) -> np.ndarray:
    """The float32 values of ``raw`` by the gguf package (the reference)."""
    return np.asarray(gq.dequantize(raw, GQT(int(qtype))), np.float32)
