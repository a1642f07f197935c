"""Sizes that the tests present as "above the parallel threshold"; tests/backend/
test_threads_reached.py proves that each of them starts a second thread."""

from __future__ import annotations

from tests.support.threadcheck import large_2d

#: graph tests (tests/ops): above every element-wise, reduction and softmax kernel's threshold
LARGE = large_2d()
LARGE_TALL = large_2d(7)  # few long rows (sum's row split)
LARGE_BY_5 = (LARGE[0], LARGE[1] + 5 - LARGE[1] % 5)  # tiles a (1, 5) operand
LARGE_CE = (large_2d(10)[1] // 16 + 1, 10)  # softmax kernels count 16 per exp

#: kernel tests (tests/kernels): 270,000 elements, enough for the kernels to start threads
KERNEL_BIG = (2, 3, 200, 225)
#: optimizer kernel sizes; the last one spans several parallel chunks
OPTIM_SIZES = [1, 7, 1000, 100_003]
