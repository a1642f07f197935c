"""Bit-exact std::mt19937 / libstdc++ algorithms (spec Appendix A and B)."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt.errors import DTypeError, InvalidValueError, ShapeError
from ggopt.opt.rng import Mt19937


def test_mt19937_default_seed_first_outputs():
    rng = Mt19937()
    assert [rng(), rng(), rng()] == [3499211612, 581869302, 3890346734]


def test_mt19937_crosses_state_blocks():
    # 624 outputs per twist; the 10000th output of mt19937(5489) is fixed by the C++ standard.
    rng = Mt19937()
    for _ in range(9999):
        rng()
    assert rng() == 4123659995


def test_shuffle_six_twice_matches_ggml():
    rng = Mt19937()
    v = np.arange(6)
    rng.shuffle(v)
    assert v.tolist() == [2, 3, 0, 5, 4, 1]
    rng.shuffle(v)
    assert v.tolist() == [0, 5, 2, 3, 4, 1]


def test_shuffle_mnist_shards_and_prefix_matches_ggml():
    rng = Mt19937()
    v = np.arange(6000, dtype=np.int64)
    rng.shuffle(v)
    assert v[:10].tolist() == [2183, 2430, 1804, 311, 4023, 1814, 909, 2789, 535, 4895]
    tail = v[5700:].copy()
    rng.shuffle(v[:5700])
    assert v[:10].tolist() == [736, 5407, 3992, 1704, 2368, 3532, 5254, 364, 3339, 5278]
    np.testing.assert_array_equal(v[5700:], tail)
    assert sorted(v.tolist()) == list(range(6000))


@pytest.mark.parametrize("n", [0, 1, 2, 5, 70000])
def test_shuffle_is_a_permutation(n):
    # 70000 >= 2**16 takes libstdc++'s one-draw-per-element path.
    v = np.arange(n)
    Mt19937().shuffle(v)
    assert sorted(v.tolist()) == list(range(n))


def test_shuffle_single_element_draws_nothing():
    rng = Mt19937()
    rng.shuffle(np.arange(1))
    assert rng() == 3499211612


def test_uniform_int_lemire_rejects_low_products():
    # For span 3 the threshold is (2**32 - 3) % 3 = 1: a raw draw of 0 gives low word 0 < 1.
    rng = Mt19937()
    raw = Mt19937()
    draws = [rng.uniform_int(10, 12) for _ in range(200)]
    expected = []
    for _ in range(200):
        product = raw() * 3
        while product & 0xFFFFFFFF < 1:
            product = raw() * 3
        expected.append(10 + (product >> 32))
    assert draws == expected
    assert set(draws) == {10, 11, 12}


def test_uniform_int_full_range_returns_raw_draw():
    rng = Mt19937()
    assert rng.uniform_int(5, 5 + 2**32 - 1) == 5 + 3499211612


def test_normal_f32_reproduces_regression_labels():
    rng = Mt19937(12345)
    i = np.arange(201, dtype=np.float32)
    x = np.float32(-100) + np.float32(200) * i / np.float32(200)
    y = np.float32(1.2) * x + np.float32(3.4) + rng.normal_f32(201, 0.0, 0.1)
    assert y.dtype == np.float32
    assert y[:3].tolist() == np.array(
        [-116.678589, -115.439079, -114.147118], dtype=np.float32
    ).tolist()


def test_canonical_f32_in_unit_interval():
    rng = Mt19937(7)
    u = [rng.canonical_f32() for _ in range(1000)]
    assert all(0 <= x < 1 for x in u)


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_out_of_range(seed):
    with pytest.raises(InvalidValueError, match="seed"):
        Mt19937(seed)


def test_seed_wrong_type():
    with pytest.raises(DTypeError, match="seed"):
        Mt19937(1.5)


def test_uniform_int_bad_range():
    rng = Mt19937()
    with pytest.raises(ShapeError, match="uniform_int"):
        rng.uniform_int(3, 2)
    assert rng() == 3499211612
