"""GemmPlan (``_kernels/_gemm.pyx``): one-thread sgemm calls over fixed pieces, any strides
BLAS reads in place, NumPy's matmul as the reference."""

from __future__ import annotations

import os

import numpy as np
import pytest
from ggopt._kernels._gemm import GemmPlan

from ggopt._kernels import _gemm
from ggopt.backend.cpu import blas
from ggopt.backend.cpu.blas import SerialBlas
from ggopt.errors import InvalidValueError, ShapeError


@pytest.fixture(params=["mkl", "openblas", "scipy"], autouse=True)
def which_sgemm(request):
    """Every test runs on each sgemm ggopt can choose that is installed here: oneMKL's,
    NumPy's ILP64 OpenBLAS, SciPy's; the chosen one is restored after."""
    blas.products_blas()
    chosen = _chosen_address()
    address = 0 if request.param == "scipy" else blas.sgemm_address(request.param)
    if address is None:
        pytest.skip(f"{request.param} is not installed here")
    _gemm.use_ilp64_sgemm(address)
    try:
        yield request.param
    finally:
        _gemm.use_ilp64_sgemm(chosen)


def _chosen_address():
    which = {v: k for k, v in blas.BLAS_NAMES.items()}[blas.products_blas()]
    return 0 if which == "scipy" else blas.sgemm_address(which)


def test_the_choice_is_named_and_stable(request):
    if request.node.callspec.params["which_sgemm"] != "mkl":
        pytest.skip("checks the choice itself, once")
    name = blas.products_blas()
    assert name == blas.products_blas()
    assert ("SciPy" not in name) == _gemm.ilp64_sgemm_in_use()
    first = "mkl" if _gemm.cpu_favours_mkl() else "openblas"
    if blas.sgemm_address(first) is not None and "GGOPT_BLAS" not in os.environ:
        assert name == blas.BLAS_NAMES[first]  # this CPU's preference, whenever installed


@pytest.mark.parametrize("favours_mkl", [True, False])
def test_the_cpu_orders_the_libraries(favours_mkl, monkeypatch, request):
    """oneMKL first on an Intel CPU or one with AVX-512, NumPy's OpenBLAS first elsewhere."""
    if request.node.callspec.params["which_sgemm"] != "mkl":
        pytest.skip("checks the choice itself, once")
    if blas.sgemm_address("mkl") is None or blas.sgemm_address("openblas") is None:
        pytest.skip("needs both oneMKL and NumPy's ILP64 OpenBLAS")
    address = _chosen_address()
    monkeypatch.setattr(_gemm, "cpu_favours_mkl", lambda: favours_mkl)
    try:
        assert blas._choose("") == blas.BLAS_NAMES["mkl" if favours_mkl else "openblas"]
    finally:
        _gemm.use_ilp64_sgemm(address)


@pytest.mark.parametrize("which", ["mkl", "openblas", "scipy"])
def test_ggopt_blas_names_the_library(which, monkeypatch):
    if which != "scipy" and blas.sgemm_address(which) is None:
        pytest.skip(f"{which} is not installed here")
    address = _chosen_address()
    monkeypatch.setenv("GGOPT_BLAS", which)
    try:
        assert blas._choose(which) == blas.BLAS_NAMES[which]
        assert _gemm.ilp64_sgemm_in_use() == (which != "scipy")
    finally:
        _gemm.use_ilp64_sgemm(address)


def test_ggopt_blas_refuses_an_unknown_name():
    in_use = _gemm.ilp64_sgemm_in_use()
    with pytest.raises(InvalidValueError, match="GGOPT_BLAS='atlas': expected one of mkl"):
        blas._choose("atlas")
    with pytest.raises(InvalidValueError, match="which must be"):
        blas.sgemm_address("atlas")
    assert _gemm.ilp64_sgemm_in_use() == in_use  # the sgemm in use is untouched


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _in_two_pieces(x, y, n_threads, packed=0):
    """``x @ y`` as one plan of two row pieces, run on ``n_threads``; ``packed`` of them copy
    their transposed ``y`` first."""
    out = np.full((x.shape[0], y.shape[1]), np.nan, np.float32)
    plan, half = GemmPlan(), x.shape[0] // 2
    for r0, r1 in ((0, half), (half, x.shape[0])):
        assert plan.add(x[r0:r1], y, out[r0:r1])
    assert plan.n_packed == packed
    with SerialBlas():
        plan.run(n_threads)
    return out


def _operand(shape, layout, seed):
    """A (rows, cols) float32 view: C order, a transpose (F order), or a strided slice."""
    r, c = shape
    if layout == "c":
        return _rand(shape, seed)
    if layout == "t":
        return _rand((c, r), seed).T
    return _rand((r + 3, 2 * c + 5), seed)[1:r + 1, 2:2 + c]  # row stride 2c+5, unit columns


@pytest.mark.parametrize("lx", ["c", "t", "s"])
@pytest.mark.parametrize("ly", ["c", "t", "s"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 5, 3), (33, 1, 17), (1, 19, 4), (64, 130, 9)])
def test_products_match_numpy(lx, ly, shape):
    r, k, c = shape
    x, y = _operand((r, k), lx, 1), _operand((k, c), ly, 2)
    out = np.full((r, c), np.nan, np.float32)
    plan = GemmPlan()
    assert plan.add(x, y, out)
    with SerialBlas():
        plan.run(2)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)


def test_split_k_sums():
    x, y = _rand((9, 40), 3), _rand((40, 6), 4)
    out, part = np.empty((9, 6), np.float32), np.empty((9, 6), np.float32)
    plan = GemmPlan()
    assert plan.add(x[:, :20], y[:20], out)
    assert plan.add(x[:, 20:], y[20:], part)
    plan.add_sum(out.reshape(-1), part.reshape(-1))
    with SerialBlas():
        plan.run(3)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)


def test_split_k_sums_then_the_accumulator():
    """``add_sum(out, part, acc)``: out += part, then acc += out (a fused weight gradient)."""
    x, y = _rand((9, 40), 3), _rand((40, 6), 4)
    out, part, alone = (np.empty((9, 6), np.float32) for _ in range(3))
    acc = _rand((9, 6), 5)
    start = acc.copy()
    plan, ref = GemmPlan(), GemmPlan()
    for p, o in ((plan, out), (ref, alone)):
        assert p.add(x[:, :20], y[:20], o)
    assert plan.add(x[:, 20:], y[20:], part)
    plan.add_sum(out.reshape(-1), part.reshape(-1), acc.reshape(-1))
    with SerialBlas():
        plan.run(2)
        ref.run(1)
    second = _rand((9, 6), 6)
    assert ref.add(x[:, 20:], y[20:], second)  # the second half again, for the reference sum
    with SerialBlas():
        ref.run(1)
    np.testing.assert_array_equal(out, alone + second)
    np.testing.assert_array_equal(acc, start + out)
    with pytest.raises(ShapeError, match="acc 5"):
        plan.add_sum(out.reshape(-1), part.reshape(-1), np.empty(5, np.float32))


@pytest.mark.parametrize("y_stride", [0, 7])
def test_packed_transposed_operand_matches_unpacked(y_stride):
    """A small 'T','N' product copies y^T first (every small mul_mat): the same values as the
    unpacked call, for 1 and 3 threads alike, also when y's rows are strided."""
    r, k, c = 40, 33, 70
    x = _rand((r, k), 21)
    y = _rand((c, k + y_stride), 22)[:, :k].T  # unit stride along k: transposed storage
    results = []
    for max_elements, min_rows in ((1 << 16, 16), (0, 1 << 30)):  # packed, then not
        _gemm.set_packing(max_elements, min_rows)
        try:
            results += [_in_two_pieces(x, y, n, packed=2 if max_elements else 0)
                        for n in (1, 3)]
        finally:
            _gemm.set_packing(1 << 16, 16)
    np.testing.assert_array_equal(results[0], results[1])  # packed: 1 thread == 3 threads
    np.testing.assert_allclose(results[0], results[2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[0], x @ y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("acc_layout", ["c", "s"])
def test_product_then_add_is_the_two_operations_bit_for_bit(acc_layout):
    """``out = x @ y; acc += out`` in one plan: the same bits as the product, then NumPy's
    float add (the accumulator may be a strided view)."""
    x, y = _rand((37, 53), 11), _rand((53, 29), 12)
    acc = _operand((37, 29), acc_layout, 13)
    start = acc.copy()
    out, alone = np.empty((37, 29), np.float32), np.empty((37, 29), np.float32)
    plan, ref = GemmPlan(), GemmPlan()
    for r0, r1 in ((0, 18), (18, 37)):
        assert plan.add(x[r0:r1], y, out[r0:r1], acc[r0:r1])
        assert ref.add(x[r0:r1], y, alone[r0:r1])
    with SerialBlas():
        plan.run(2)
        ref.run(1)
    np.testing.assert_array_equal(out, alone)
    np.testing.assert_array_equal(acc, start + alone)


def test_product_then_add_refuses_a_transposed_or_misshapen_accumulator():
    x, y, out = _rand((8, 5), 1), _rand((5, 6), 2), np.empty((8, 6), np.float32)
    plan = GemmPlan()
    assert not plan.add(x, y, out, _rand((6, 8), 3).T)  # no unit column stride
    with pytest.raises(ShapeError, match="acc"):
        plan.add(x, y, out, _rand((8, 5), 3))
    assert plan.n_items == 0


def test_empty_reduction_gives_zeros():
    x, y = np.empty((4, 0), np.float32), np.empty((0, 3), np.float32)
    zero, acc = np.ones((4, 3), np.float32), np.ones((4, 3), np.float32)
    plan = GemmPlan()
    assert plan.add(x, y, zero, acc)
    plan.run(1)
    assert (zero == 0).all() and (acc == 1).all()


def test_layouts_blas_cannot_read_are_refused_untouched():
    x = _rand((6, 8), 6)[:, ::2]  # no unit stride
    y, out = _rand((4, 5), 7), np.empty((6, 5), np.float32)
    plan = GemmPlan()
    assert not plan.add(x, y, out)
    assert plan.n_items == 0
    unaligned = np.frombuffer(np.zeros(4 * 24 + 1, np.uint8).data, np.uint8)[1:].view(np.float32)
    assert not plan.add(unaligned.reshape(4, 6)[:, ::2], _rand((3, 2), 8),
                        np.empty((4, 2), np.float32))


def test_thread_count_never_changes_bits():
    x, y = _rand((300, 257), 9), _rand((257, 131), 10)
    outs = [_in_two_pieces(x, y, n) for n in (1, 2, 3, 7)]
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_bad_arguments():
    plan = GemmPlan()
    with pytest.raises(ShapeError, match="does not give"):
        plan.add(_rand((3, 4), 1), _rand((5, 2), 2), np.empty((3, 2), np.float32))
    with pytest.raises(ShapeError, match="elements"):
        plan.add_sum(np.empty(3, np.float32), np.empty(4, np.float32))
    with pytest.raises(InvalidValueError, match="n_threads"):
        plan.run(0)
    with pytest.raises(ValueError):  # a read-only output
        ro = np.empty((3, 2), np.float32)
        ro.flags.writeable = False
        plan.add(_rand((3, 4), 1), _rand((4, 2), 2), ro)


def test_products_are_cut_by_their_shape_alone():
    """Long reductions (weight gradients) in two halves; a weight too large for the caches
    by columns; else rows, else columns; small products whole (cpu_ops/linalg.py)."""
    from ggopt.backend.cpu.ops.linalg import _cut

    assert _cut(128, 2048, 128) == "inner"  # a weight gradient over 2048 tokens
    assert _cut(384, 2048, 128) == "inner"
    assert _cut(2048, 128, 384) == "rows"  # a forward product
    assert _cut(256, 576, 1536) == "rows"  # a projection: its 3.5 MB weight stays cached
    assert _cut(256, 576, 49152) == "cols"  # the output layer: each half streams half of it
    assert _cut(49152, 256, 576) == "rows"  # its weight gradient
    assert _cut(100, 300, 500) == "cols"
    assert _cut(500, 784, 500) == "rows"  # MNIST's fc1: K < 4x the output's sides
    assert _cut(64, 64, 64) is None  # below the size worth two pieces
    assert _cut(500, 500, 10) == "rows"  # MNIST's fc2 (2.5M multiply-adds)
    # a rank-8 LoRA adapter's products stay one piece (a region costs more than they do)
    assert _cut(256, 576, 8) is None  # A x
    assert _cut(256, 8, 1536) is None  # B h, K = 8
    assert _cut(8, 256, 576) is None  # dA
    assert _cut(2048, 8, 2048) == "rows"  # large enough to be worth two pieces
