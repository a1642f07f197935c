"""ggml's integer products of a quantized weight (``_quant_dot.mul_mat_q8``) and the rounding of
the activations to the weight type's vec_dot_type (``_quant_dot.quantize_activations``) against
the NumPy port in ``backend/array/ops/quant.py``: the Q8 codes, scales and sums bit for bit
(ties, zeros, equal blocks, huge values, NaN and infinities), the products bit for bit on odd
shapes and strided views, on 1, 2 and 3 threads, with the AVX-512 VNNI kernel and the forced
portable one. (llama.cpp's own functions: test_quant_dot_interop.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from ggopt import quants
from ggopt._kernels import _quant_dot
from ggopt.backend.array.ops import quant as ref
from ggopt.errors import DTypeError, InvalidValueError, ShapeError
from ggopt.types import GGType
from tools.kquants import K_TYPES, k_blocks

TYPES = [GGType.Q4_0, GGType.Q4_1, GGType.Q5_0, GGType.Q5_1, GGType.Q8_0, *K_TYPES]
IDS = {"ids": lambda t: t.name}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def _weights(qtype: GGType, rows: int, cols: int, seed: int) -> np.ndarray:
    if qtype.can_quantize:
        w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
        return quants.quantize(w, qtype)
    return k_blocks(qtype, rows, cols, seed=seed)


def _activations(qtype: GGType, x: np.ndarray, n_threads: int = 1):
    n, k = x.shape
    qb = ref.VEC_DOT_TYPES[int(qtype)][1]
    q, d = np.empty((n, k), np.int8), np.empty((n, k // qb), np.float32)
    s, sums = np.empty((n, k // 32), np.float32), np.empty((n, k // 16), np.int32)
    _quant_dot.quantize_activations(x, int(qtype), q, d, s, sums, n_threads)
    return q, d, s, sums


def _hard_rows(qb: int) -> np.ndarray:
    """Rows of blocks that test the rounding: ties at .5, zeros, all-equal blocks, huge and
    tiny magnitudes, NaN and infinities."""
    rng = np.random.default_rng(7)
    n = 4 * qb
    rows = [rng.standard_normal(n) * 3,
            (np.arange(n) - n / 2) * (127 / (n / 2)),          # exact multiples: ties
            rng.integers(-127, 128, n) + 0.5,                   # .5 after scaling by 1
            np.zeros(n), np.full(n, 2.5), np.full(n, -1e30),
            rng.standard_normal(n) * 1e38, rng.standard_normal(n) * 1e-30]
    bad = rng.standard_normal(n)
    bad[[3, qb + 5, 2 * qb + 9]] = np.nan
    bad[[7, 2 * qb + 1, 3 * qb]] = np.inf
    bad[qb + 2] = -np.inf
    infinite = np.where(np.isnan(bad), 1.0, bad)  # infinities without NaN
    rows += [bad, infinite]
    with np.errstate(over="ignore"):
        return np.array(rows).astype(np.float32)


KERNELS = _quant_dot.available()


@pytest.mark.parametrize("qtype", [GGType.Q8_0, GGType.Q4_1, GGType.Q4_K], **IDS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("copies", [1, 5])
def test_activation_rounding_is_the_numpy_port_bit_for_bit(qtype, kernel, copies):
    """With AVX-512 (the amx and vnni kernels) and the portable C: the same bits. Rows of 4
    blocks, and of 21 (the hard blocks five times and one more: the AVX-512 code takes 16 blocks
    at a time and sums codes 128 at a time)."""
    rows = _hard_rows(ref.VEC_DOT_TYPES[int(qtype)][1])
    x = np.ascontiguousarray(np.concatenate([rows] * copies + [rows[:, :rows.shape[1] // 4]]
                                            * (copies > 1), axis=1))
    assert_rounding_is_the_port(qtype, kernel, x)


def assert_rounding_is_the_port(qtype, kernel, x):
    """``kernel``'s rounding of the rows of ``x`` (codes, scales, 16-sums, Q8_1's sums) is the
    NumPy port's, bit for bit."""
    try:
        _quant_dot.set_kernel(kernel)
        q, d, s, sums = _activations(qtype, x)
    finally:
        _quant_dot.set_kernel("auto")
    rq, rd, rs = ref.q8_activations(x, int(qtype))
    bias = 128 if qtype == GGType.Q8_0 else 0  # a Q8_0 weight's activations: u8 codes
    codes = (q.view(np.uint8).astype(np.int32) - 128) if bias else q.astype(np.int32)
    np.testing.assert_array_equal(codes, rq.reshape(q.shape))
    np.testing.assert_array_equal(d, rd, strict=True)  # NaN where ggml's scale is NaN
    np.testing.assert_array_equal(sums, codes.reshape(len(x), -1, 16).sum(-1))
    if rs is not None:
        np.testing.assert_array_equal(s, rs)


@pytest.mark.parametrize("qtype", [GGType.Q8_0, GGType.Q4_1], **IDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_nan_in_any_of_16_blocks_rounds_as_ggml(qtype, kernel):
    """A NaN's place in ggml's lane tree decides its block's max|x|, and the AVX2 and AVX-512
    roundings take blocks 1 and 16 at a time: one NaN (or -NaN) in each block of a 16-block
    chunk in turn, at every lane position."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((32, 18 * 32)) * 4).astype(np.float32)
    for r in range(32):
        x[r, (r % 16) * 32 + r] = np.nan if r % 2 else -np.nan
    assert_rounding_is_the_port(qtype, kernel, x)


def test_q8_rounding_details():
    """Q8_0: nearest even after multiplying by 127/amax; an all-zero block has d = 0; an
    infinity makes its block's codes -128 except zeros (inf * 0 is NaN). Q8_K: the element of
    largest magnitude maps to -127 (d = max / -127) and a NaN element to 0."""
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 0.5, 1.5, -2.5]
    q, d, _, _ = _activations(GGType.Q4_0, x)
    assert q[0, :4].tolist() == [127, 0, 2, -2] and d[0, 0] == np.float32(
        np.float16(1.0))
    q, d, _, _ = _activations(GGType.Q4_0, np.zeros((1, 32), np.float32))
    assert not q.any() and d[0, 0] == 0
    x = np.ones((1, 256), np.float32)
    x[0, 10], x[0, 11] = -4.0, np.nan
    q, d, _, _ = _activations(GGType.Q4_K, x)
    assert q[0, 10] == -127 and q[0, 11] == 0 and q[0, 0] == 32
    assert d[0, 0] == np.float32(1) / (np.float32(-127) / np.float32(-4))


@pytest.mark.parametrize("qtype", TYPES, **IDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_product_is_the_numpy_port_bit_for_bit(qtype, kernel):
    """7 and 37 activation rows (AMX: two tiles of 16 rows and a VNNI tail of 5)."""
    k = 512
    raw = _weights(qtype, 45, k, seed=int(qtype))
    x = np.random.default_rng(1).standard_normal((37, k)).astype(np.float32)
    try:
        _quant_dot.set_kernel(kernel)
        for rows in (7, 37):
            want = ref.int_product(raw, int(qtype), x[:rows])
            for n in (1, 2, 3):
                out = np.full((rows, 45), np.nan, np.float32)
                _quant_dot.mul_mat_q8(raw, int(qtype), x[:rows], out, n)
                np.testing.assert_array_equal(_bits(out), _bits(want))
    finally:
        _quant_dot.set_kernel("auto")
    x = x[:7]
    want = ref.int_product(raw, int(qtype), x)
    deq = quants.dequantize(raw, qtype)
    f32 = x @ deq.T  # the activations' rounding: about 1 % of the products' spread
    assert 0 < np.abs(want - f32).max() < 0.02 * np.abs(f32).max()


@pytest.mark.parametrize("qtype", [GGType.Q4_1, GGType.Q8_0, GGType.Q6_K], **IDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_product_of_views_odd_sizes_and_tails(qtype, kernel):
    """Strided weight rows, strided activation and output rows, 1..37 rows of each (every
    tail of the 4-row, 16-row (AMX) and 32-row blocks)."""
    k = 256
    raw = _weights(qtype, 37, k, seed=3)
    wide = np.zeros((37, raw.shape[1] + 40), np.uint8)
    wide[:, 5:5 + raw.shape[1]] = raw
    x = np.random.default_rng(4).standard_normal((21, k + 3)).astype(np.float32)
    try:
        _quant_dot.set_kernel(kernel)
        for n, m in ((1, 1), (3, 17), (5, 32), (9, 37), (21, 33)):
            out = np.full((n, m + 2), 7.0, np.float32)
            _quant_dot.mul_mat_q8(wide[:m, 5:5 + raw.shape[1]], int(qtype), x[:n, 1:k + 1],
                                  out[:, 1:m + 1], 2)
            want = ref.int_product(raw[:m], int(qtype), x[:n, 1:k + 1])
            np.testing.assert_array_equal(_bits(out[:, 1:m + 1]), _bits(want))
            assert (out[:, 0] == 7).all() and (out[:, -1] == 7).all()
    finally:
        _quant_dot.set_kernel("auto")


def _products(kernel: str, raw: np.ndarray, qtype: GGType, x: np.ndarray,
              packed: bool = False) -> list[bytes]:
    """mul_mat_q8's outputs with ``kernel`` on 1, 2 and 3 threads (from panels packed once
    when ``packed``), as bytes."""
    outs = []
    try:
        _quant_dot.set_kernel(kernel)
        panels = None
        if packed:
            panels = np.empty(_quant_dot.packed_shape(int(qtype), raw.shape[0], x.shape[1]),
                              np.uint8)
            _quant_dot.pack_weight(raw, int(qtype), panels, 2)
        for n in (1, 2, 3):
            out = np.full((x.shape[0], raw.shape[0]), np.nan, np.float32)
            _quant_dot.mul_mat_q8(raw, int(qtype), x, out, n, packed=panels)
            outs.append(out.tobytes())
    finally:
        _quant_dot.set_kernel("auto")
    return outs


SIMD_KERNELS = [k for k in KERNELS if k != "portable"]


@pytest.mark.parametrize("qtype", TYPES, **IDS)
@pytest.mark.parametrize("kernel", SIMD_KERNELS)
def test_every_kernel_gives_the_portable_kernels_bytes(qtype, kernel):
    """One block (K = 32 or 256) and three; odd activation rows (1, 5, 7: the 4-row tails);
    weight rows that are no multiple of 16 or 32 (13, 17, 45); the weight, activations and
    outputs strided views; cached panels and per-call ones; 1, 2 and 3 threads."""
    qb = qtype.blck_size
    for k in (qb, 3 * qb):
        raw = _weights(qtype, 45, k, seed=11 + int(qtype))
        wide = np.zeros((45, raw.shape[1] + 6), np.uint8)
        wide[:, 2:2 + raw.shape[1]] = raw
        xs = np.random.default_rng(k).standard_normal((7, k + 2)).astype(np.float32)
        for n, m in ((1, 13), (5, 17), (7, 45)):
            w, x = wide[:m, 2:2 + raw.shape[1]], xs[:n, 1:k + 1]
            want = ref.int_product(raw[:m], int(qtype), x).tobytes()
            for packed in (False, True):
                mine = _products(kernel, w, qtype, x, packed)
                assert mine == _products("portable", w, qtype, x, packed) == [want] * 3
        out = np.full((7, 47), 5.0, np.float32)  # a strided output view
        try:
            _quant_dot.set_kernel(kernel)
            _quant_dot.mul_mat_q8(wide[:, 2:2 + raw.shape[1]], int(qtype), xs[:, 1:k + 1],
                                  out[:, 1:46], 2)
        finally:
            _quant_dot.set_kernel("auto")
        want = ref.int_product(raw, int(qtype), xs[:, 1:k + 1])
        assert out[:, 1:46].tobytes() == want.tobytes()
        assert (out[:, 0] == 5).all() and (out[:, 46] == 5).all()


def _hostile_weights(qtype: GGType, rows: int, cols: int) -> np.ndarray:
    """Blocks of the largest codes a file can hold, with finite scales: every unsigned code at
    its top (3, 7, 15, 31, 63), Q8_0's codes -128 and 127 (rows of each, and mixed), the
    K-quants' largest scales and minimums (Q3_K's 31 and -32, Q6_K's -128 and 127)."""
    raw = _weights(qtype, rows, cols, seed=9).copy()
    blocks = raw.reshape(rows, -1, qtype.size)
    if qtype == GGType.Q8_0:
        codes = np.random.default_rng(9).choice(np.array([-128, 127, -1, 0], np.int8),
                                                (rows, blocks.shape[1], 32))
        codes[0], codes[1] = -128, 127
        blocks[..., 2:] = codes.view(np.uint8)
    elif qtype in (GGType.Q4_K, GGType.Q5_K):
        blocks[..., 4:] = 0xFF
    elif qtype == GGType.Q2_K:
        blocks[..., :80] = 0xFF
    elif qtype == GGType.Q3_K:  # codes 7 (value 3); scales 63 and 0 (31 and -32)
        blocks[..., :96] = 0xFF
        blocks[..., 96:108] = np.array([0x0F] * 8 + [0x33] * 4, np.uint8)
    elif qtype == GGType.Q6_K:
        blocks[..., :192] = 0xFF
        blocks[..., 192:208] = np.array([0x80, 0x7F] * 8, np.uint8)
    else:  # nibbles (and Q5's fifth bits) all set
        blocks[..., {GGType.Q4_0: 2, GGType.Q4_1: 4, GGType.Q5_0: 2, GGType.Q5_1: 4}[qtype]:] = \
            0xFF
    return raw


@pytest.mark.parametrize("qtype", TYPES, **IDS)
@pytest.mark.parametrize("kernel", SIMD_KERNELS)
def test_hostile_codes_and_saturated_activations_are_exact(qtype, kernel):
    """The largest codes against activations at -128 (Q8_0/Q8_1: NaN elements that the block's
    maximum skips), -127 and 127: where vpmaddubsw would saturate (Q8_0's signed codes against
    biased activations) or 16-bit pair sums would overflow, the integers stay exact."""
    qb = qtype.blck_size
    raw = _hostile_weights(qtype, 37, 2 * qb)
    x = _saturating_rows(2 * qb, seed=3)
    q, _, _, _ = _activations(qtype, x)
    codes = q.view(np.uint8).astype(np.int32) - 128 if qtype == GGType.Q8_0 else q
    assert codes.min() == (-127 if qb == 256 else -128) and codes.max() == 127
    assert_kernel_gives_the_port(kernel, raw, qtype, x)


@pytest.mark.parametrize("qtype", TYPES, **IDS)
@pytest.mark.parametrize("kernel", SIMD_KERNELS)
def test_hostile_codes_on_whole_tiles_are_exact(qtype, kernel):
    """The hostile weights and saturated activations above on 67 rows, so that the AMX kernel
    (where the CPU has it) takes whole 16-row tiles and the rest the VNNI kernel: the K-quants'
    planes at their largest (code * scale bytes up to 217, Q3_K's signed ones) summed over whole
    super-blocks stay exact; the bits of the NumPy port and the portable kernel."""
    qb = qtype.blck_size
    raw = _hostile_weights(qtype, 37, 2 * qb)
    x = np.tile(_saturating_rows(2 * qb, seed=4), (9, 1))[:67]
    assert_kernel_gives_the_port(kernel, raw, qtype, x)


def _saturating_rows(k, seed):
    """Activation rows at the edges of the 8-bit codes: all -1 (codes -127), all 1, alternating
    signs, NaN heads of each 32-block (codes -128 with a finite scale; not for Q8_K), the same
    with the rest alternating, every third element 1, one random row, and codes 127 but one 126
    per 32 (odd sums of the top codes: any partial sum taken through float beyond 2^24 would
    round them)."""
    x = np.full((8, k), -1.0, np.float32)
    x[1] = 1.0
    x[2] = np.where(np.arange(k) % 2, 1.0, -1.0)
    x[3].reshape(-1, 32)[:, :8] = np.nan
    x[4].reshape(-1, 32)[:, :8] = np.nan
    x[4, 8::2] = 1.0
    x[5] = np.where(np.arange(k) % 3, -1.0, 1.0)
    x[6] = np.random.default_rng(seed).standard_normal(k)
    x[7] = 1.0
    x[7, ::32] = 126 / 127
    return x


def assert_kernel_gives_the_port(kernel, raw, qtype, x):
    """The kernel's products, per call and from packed panels, on 1..3 threads: the bits of the
    portable kernel and of the NumPy port, which must be finite and not all zero."""
    want = ref.int_product(raw, int(qtype), x)
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    for packed in (False, True):
        mine = _products(kernel, raw, qtype, x, packed)
        assert mine == _products("portable", raw, qtype, x, packed) == [want.tobytes()] * 3


@pytest.mark.parametrize("qtype", TYPES, **IDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_packed_panels_give_the_same_bits(qtype, kernel):
    """Panels packed once (pack_weight) and passed to mul_mat_q8: the bits of the NumPy port
    for 1..4 rows (the one-token products), 9, 16 and 35 (AMX tiles and tails), on 1, 2 and 3
    threads, for a strided weight view whose rows end in a partial panel."""
    k = 512
    raw = _weights(qtype, 45, k, seed=5 + int(qtype))
    wide = np.zeros((45, raw.shape[1] + 8), np.uint8)
    wide[:, 3:3 + raw.shape[1]] = raw
    view = wide[:, 3:3 + raw.shape[1]]
    x = np.random.default_rng(2).standard_normal((35, k)).astype(np.float32)
    panels = np.full(_quant_dot.packed_shape(int(qtype), 45, k), 0xAB, np.uint8)
    assert panels.shape[0] == 2  # 32 + 13 rows
    try:
        _quant_dot.set_kernel(kernel)
        _quant_dot.pack_weight(view, int(qtype), panels, 3)
        for n_rows in (1, 2, 3, 4, 9, 16, 35):
            want = ref.int_product(raw, int(qtype), x[:n_rows])
            for n in (1, 2, 3):
                out = np.full((n_rows, 45), np.nan, np.float32)
                _quant_dot.mul_mat_q8(view, int(qtype), x[:n_rows], out, n, packed=panels)
                np.testing.assert_array_equal(_bits(out), _bits(want))
    finally:
        _quant_dot.set_kernel("auto")
    again = np.empty_like(panels)
    _quant_dot.pack_weight(raw, int(qtype), again, 1)
    np.testing.assert_array_equal(again, panels)  # packing does not depend on the threads


@pytest.mark.parametrize("qtype", TYPES, **IDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_row_strips_chunks_and_tails_give_the_same_bits(qtype, kernel):
    """The AMX kernel's blocking: 16, 48, 65 and 100 activation rows (whole and partial strips
    of 64 rows, tails below 16), K of one block and of three (a last chunk of one step), 37
    weight rows (a partial panel), packed panels and per-call packing, 1, 2 and 3 threads."""
    qb = qtype.blck_size
    x = np.random.default_rng(9).standard_normal((100, 3 * qb)).astype(np.float32)
    try:
        _quant_dot.set_kernel(kernel)
        for k in (qb, 3 * qb):
            raw = _weights(qtype, 37, k, seed=11 + int(qtype))
            panels = np.empty(_quant_dot.packed_shape(int(qtype), 37, k), np.uint8)
            _quant_dot.pack_weight(raw, int(qtype), panels, 2)
            for rows in (16, 48, 65, 100):
                want = ref.int_product(raw, int(qtype), x[:rows, :k])
                for n in (1, 2, 3):
                    for packed in (None, panels):
                        out = np.full((rows, 37), np.nan, np.float32)
                        _quant_dot.mul_mat_q8(raw, int(qtype), x[:rows, :k], out, n,
                                              packed=packed)
                        np.testing.assert_array_equal(_bits(out), _bits(want))
    finally:
        _quant_dot.set_kernel("auto")


@pytest.mark.skipif(KERNELS == ["portable"], reason="no AVX2 on this CPU")
@pytest.mark.parametrize("qtype", TYPES, **IDS)
def test_avx2_packing_gives_the_portable_panels(qtype):
    """The AVX2 decoding of the blocks into panels (every kernel but the portable one) against
    the portable C's, byte for byte: random bytes as blocks (every code, scale and minimum
    pattern, NaN and infinite F16 scales), 45 rows (a partial panel), packed once and per call
    (the products of each packing agree too)."""
    k = 1024
    shape = _weights(qtype, 45, k, seed=3).shape  # the rows' bytes
    raw = np.random.default_rng(4).integers(0, 256, shape, dtype=np.uint8)
    x = np.random.default_rng(5).standard_normal((20, k)).astype(np.float32)
    panels, outs = {}, {}
    try:
        for kernel in KERNELS:
            _quant_dot.set_kernel(kernel)
            panels[kernel] = np.empty(_quant_dot.packed_shape(int(qtype), 45, k), np.uint8)
            _quant_dot.pack_weight(raw, int(qtype), panels[kernel], 2)
            outs[kernel] = np.empty((20, 45), np.float32)
            _quant_dot.mul_mat_q8(raw, int(qtype), x, outs[kernel], 2)
    finally:
        _quant_dot.set_kernel("auto")
    finite = np.isfinite(outs["portable"])
    for kernel in KERNELS:
        np.testing.assert_array_equal(panels[kernel], panels["portable"], err_msg=kernel)
        np.testing.assert_array_equal(np.isfinite(outs[kernel]), finite, err_msg=kernel)
        np.testing.assert_array_equal(_bits(outs[kernel][finite]),
                                      _bits(outs["portable"][finite]), err_msg=kernel)


def test_packed_panels_of_the_wrong_shape_are_refused():
    raw = quants.quantize(np.ones((40, 64), np.float32), GGType.Q4_1)
    x, out = np.ones((1, 64), np.float32), np.full((1, 40), 7.0, np.float32)
    rows, width = _quant_dot.packed_shape(int(GGType.Q4_1), 40, 64)
    assert rows == 2
    for bad in ((1, width), (rows, width + 1)):
        with pytest.raises(ShapeError, match="packed"):
            _quant_dot.mul_mat_q8(raw, int(GGType.Q4_1), x, out, 1,
                                  packed=np.zeros(bad, np.uint8))
        with pytest.raises(ShapeError, match="panels"):
            _quant_dot.pack_weight(raw, int(GGType.Q4_1), np.zeros(bad, np.uint8), 1)
    assert (out == 7).all()
    with pytest.raises(ShapeError, match="blocks"):
        _quant_dot.packed_shape(int(GGType.Q4_1), 40, 48)
    with pytest.raises(DTypeError, match="integer product"):
        _quant_dot.packed_shape(0, 40, 64)
    with pytest.raises(ShapeError, match="blocks"):
        _quant_dot.pack_weight(raw[:, :30], int(GGType.Q4_1), np.zeros((2, width), np.uint8), 1)


def test_vnni_kernel_is_used_on_a_cpu_that_has_it():
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    has = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"))
    assert _quant_dot.vnni_kernel() == has
    _quant_dot.force_portable(True)
    try:
        assert not _quant_dot.vnni_kernel()
    finally:
        _quant_dot.force_portable(False)


def test_kernel_choice():
    """AMX is chosen when the CPU has AMX-INT8 and AMX-TILE (and the OS lets the process use
    the tiles); a kernel the CPU lacks or an unknown name is refused and changes nothing."""
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    assert _quant_dot.available()[-1] == "portable"
    assert ("amx" in _quant_dot.available()) <= all(f in flags for f in ("amx_int8", "amx_tile"))
    assert _quant_dot.kernel() == _quant_dot.available()[0]
    avx2 = all(f in flags.split() for f in ("avx2", "fma"))  # the AVX2 kernels (GCC >= 11)
    assert ("avx2" in _quant_dot.available()) == avx2
    assert ("avxvnni" in _quant_dot.available()) == (avx2 and "avx_vnni" in flags.split())
    if "avx512_vnni" not in flags.split() and avx2:  # a laptop: an AVX2 kernel by default
        assert _quant_dot.kernel() in ("avxvnni", "avx2")
    with pytest.raises(InvalidValueError, match="unknown kernel"):
        _quant_dot.set_kernel("avx9")
    for name in {"amx", "vnni", "avxvnni", "avx2"} - set(_quant_dot.available()):
        with pytest.raises(InvalidValueError, match="has no"):
            _quant_dot.set_kernel(name)
    assert _quant_dot.kernel() == _quant_dot.available()[0]
    try:
        for name in _quant_dot.available():
            _quant_dot.set_kernel(name)
            assert _quant_dot.kernel() == name
    finally:
        _quant_dot.set_kernel("auto")


def test_non_finite_scales_give_nan_or_inf_not_a_crash():
    raw = quants.quantize(np.ones((3, 64), np.float32), GGType.Q4_1)
    raw[1, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    x = np.ones((2, 64), np.float32)
    x[1, 3] = np.nan
    out = np.empty((2, 3), np.float32)
    _quant_dot.mul_mat_q8(raw, int(GGType.Q4_1), x, out, 2)
    want = ref.int_product(raw, int(GGType.Q4_1), x)
    np.testing.assert_array_equal(out, want)
    assert np.isfinite(out[0, 0]) and not np.isfinite(out[:, 1]).any()


@pytest.mark.parametrize("qtype", TYPES, **IDS)
@pytest.mark.parametrize("kernel", SIMD_KERNELS)
def test_non_finite_inputs_give_the_portable_kernels_values(qtype, kernel):
    """Infinite and NaN (several payloads) weight scales and activations: NaN in the same
    outputs as the portable kernel and every other output's bytes equal (a NaN's payload and
    sign may differ: which operand's NaN an instruction passes on is the compiler's choice)."""
    k = 512
    raw = _weights(qtype, 37, k, seed=17).copy()
    blocks = raw.reshape(37, -1, qtype.size)
    at = 208 if qtype == GGType.Q6_K else 0  # the F16 scale d
    for row, blk, bits in ((3, -1, 0x7C00), (5, 0, 0x7E01), (5, -1, 0xFE33), (9, 0, 0xFC00)):
        blocks[row, blk, at:at + 2] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
    x = np.random.default_rng(5).standard_normal((7, k)).astype(np.float32)
    xb = x.view(np.uint32)
    xb[1, 40], xb[1, 300], xb[2, 3], xb[4, 100] = 0x7FC01234, 0xFFC05678, 0x7F800000, 0x7FA00001
    got, want = (np.frombuffer(b"".join(_products(kn, raw, qtype, x)), np.float32)
                 for kn in (kernel, "portable"))
    nan = np.isnan(want)
    assert nan.any() and (~nan).any()
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert got[~nan].tobytes() == want[~nan].tobytes()


def test_refusals():
    raw = quants.quantize(np.ones((3, 64), np.float32), GGType.Q4_0)
    with pytest.raises(ShapeError, match="out"):
        _quant_dot.mul_mat_q8(raw, int(GGType.Q4_0), np.ones((2, 64), np.float32),
                          np.empty((2, 4), np.float32), 1)
    with pytest.raises(ShapeError, match="bytes"):
        _quant_dot.mul_mat_q8(raw, int(GGType.Q4_0), np.ones((2, 96), np.float32),
                          np.empty((2, 3), np.float32), 1)
    with pytest.raises(DTypeError, match="integer product|quantized type"):
        _quant_dot.mul_mat_q8(raw, 0, np.ones((2, 64), np.float32),
                          np.empty((2, 3), np.float32), 1)
    with pytest.raises(ShapeError, match="256-element"):
        _activations(GGType.Q4_K, np.ones((1, 64), np.float32))
