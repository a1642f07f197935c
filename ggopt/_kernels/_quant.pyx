"""Quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; the K-quants Q2_K ... Q6_K, whose 256-element
super-blocks are read, never written): conversion to and from float32, row
gathers, and the products of a quantized weight with float32 activations (``*_quantized``;
ggml's integer products, which mul_mat computes, are ``_quant_dot.pyx``).

The block arithmetic is in ``_quant_blocks.h`` (ggml's reference quantizer and dequantizer)
and ``_quant_kblocks.h`` (the K-quants' dequantizer).
Raw tensors are uint8 arrays of rows of whole blocks, unit stride inside a row and any stride
between rows. Every row or panel is computed the same way whichever thread runs it, so the
results do not depend on ``n_threads``. Shapes, types, thread counts and indices are checked
before anything is written (ShapeError / DTypeError / InvalidValueError).

The products dequantize a panel of weight rows (or, for the gradient, of block columns) into a
per-thread float32 scratch and run one single-threaded BLAS ``sgemm`` on it (``_gemm``), panels
cut from the shapes alone: no float32 copy of the whole weight is made.
"""

from cython.parallel cimport prange
from libc.stdint cimport int32_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from ggopt._kernels._common cimport check_n_threads, check_shape
from ggopt._kernels._gemm cimport sgemm_colmajor
from ggopt._kernels._openmp cimport omp_get_thread_num

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import DTypeError, ShapeError

cdef extern from "_quant_blocks.h" nogil:
    int ggopt_q_block_bytes(int type)
    int ggopt_q_block_elems(int type)
    int ggopt_q_can_quantize(int type)
    void ggopt_dequant_row(int type, const uint8_t *src, float *dst, Py_ssize_t n, int vec)
    int ggopt_blocks_avx2()
    void ggopt_quant_row(int type, const float *src, uint8_t *dst, Py_ssize_t n)
    float ggopt_f16_to_f32(unsigned short h)
    unsigned short ggopt_f32_to_f16(float f)

cdef enum:
    QK = 32
# Q5_0 / Q5_1 blocks dequantized with AVX2 where the CPU has it (set_vectorized).
cdef int _vec = ggopt_blocks_avx2()
# Below this many elements a conversion runs on the calling thread only.
cdef Py_ssize_t MIN_PARALLEL_WORK = min_parallel_work(1 << 14)
# Weight rows per panel of mul_mat_q, block columns per panel of out_prod_q (sizes that cut
# llama's 192/576/1536-wide weights into even panel counts for 2 threads).
cdef Py_ssize_t PANEL_ROWS = 48
cdef Py_ssize_t PANEL_BLOCKS = 3
# out_prod_q sums over at most this many weight rows per task (a 49152-row output head: 12
# chunks per panel, summed in order; its scratch would otherwise be M x 96 floats per thread);
# the partial sums of only as many chunks at a time as the threads need are held.
cdef Py_ssize_t SUM_ROWS = 4096
# block columns per panel when the sum is chunked (wide panels: the chunks give the tasks)
cdef Py_ssize_t CHUNKED_PANEL_BLOCKS = 9


def set_vectorized(bint on) -> bool:
    """Dequantize Q5_0 / Q5_1 blocks with AVX2 (True, the default where the CPU has it) or
    the portable C (False; the same values, for tests and measurements). Returns whether AVX2
    is now used (False on a CPU without it)."""
    global _vec
    _vec = on and ggopt_blocks_avx2()
    return bool(_vec)


cdef int _block_bytes(str fn, int qtype) except -1:
    cdef int bb = ggopt_q_block_bytes(qtype)
    if bb == 0:
        raise DTypeError(f"{fn}: type {qtype} is not a quantized type this kernel knows "
                         "(Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q2_K=10, Q3_K=11, Q4_K=12, "
                         "Q5_K=13, Q6_K=14)")
    return bb


cdef Py_ssize_t _blocks_of_row(str fn, int qtype, Py_ssize_t row_bytes,
                               Py_ssize_t ne0) except -1:
    """Blocks per row, checking that ``row_bytes`` are exactly the blocks of ``ne0`` elements."""
    cdef int bb = _block_bytes(fn, qtype)
    cdef Py_ssize_t qk = ggopt_q_block_elems(qtype)
    if ne0 % qk:
        raise ShapeError(f"{fn}: rows of {ne0} elements are not whole {qk}-element blocks")
    if row_bytes != ne0 // qk * bb:
        raise ShapeError(f"{fn}: a row of {ne0} elements of type {qtype} is {ne0 // qk * bb} "
                         f"bytes ({ne0 // qk} blocks of {bb}), the raw rows have {row_bytes}")
    return ne0 // qk


cdef int _check_unit(str fn, str name, Py_ssize_t n, Py_ssize_t stride,
                     Py_ssize_t itemsize) except -1:
    """ShapeError unless a row of ``n`` items has a unit stride (rows may be spaced freely)."""
    if n > 1 and stride != itemsize:
        raise ShapeError(f"{fn}: {name} needs a unit stride along its rows, got a stride of "
                         f"{stride} bytes")
    return 0


cdef inline const uint8_t *_row_at(const char *base, Py_ssize_t offset) noexcept nogil:
    return <const uint8_t *>(base + offset)


def _f16_bits(float x) -> int:
    """The F16 bits of ``x``, rounded to nearest even (the scales' conversion; for tests)."""
    return ggopt_f32_to_f16(x)


def _f16_value(unsigned short h) -> float:
    """The float32 value of the F16 bits ``h`` (for tests)."""
    return ggopt_f16_to_f32(h)


def dequantize_rows(const uint8_t[:, :, :, :] src not None, int qtype,
                    float[:, :, :, ::1] dst not None, int n_threads):
    """``dst`` = the float32 values of the blocks in ``src`` (ggml's dequantize_row_*).

    Parameters
    ----------
    src : (n3, n2, n1, row bytes) uint8, unit stride in a row (else ShapeError)
    qtype : ggml type code
    dst : (n3, n2, n1, ne0) float32, C-contiguous, overwritten
    """
    cdef str fn = "dequantize_rows"
    check_n_threads(fn, n_threads)
    _check_unit(fn, "src", src.shape[3], src.strides[3], 1)
    check_shape(fn, "dst's leading dims", dst.shape, 3, src.shape[0], src.shape[1], src.shape[2])
    cdef Py_ssize_t nb = _blocks_of_row(fn, qtype, src.shape[3], dst.shape[3])
    cdef Py_ssize_t n2 = src.shape[1], n1 = src.shape[2], ne0 = dst.shape[3]
    cdef Py_ssize_t nrows = src.shape[0] * n2 * n1, r
    if nrows == 0 or nb == 0:
        return
    cdef const char *sb = <const char *>&src[0, 0, 0, 0]
    cdef Py_ssize_t s3 = src.strides[0], s2 = src.strides[1], s1 = src.strides[2]
    cdef float *db = &dst[0, 0, 0, 0]
    with nogil:
        for r in prange(nrows, schedule="static", num_threads=n_threads,
                        use_threads_if=nrows * ne0 >= MIN_PARALLEL_WORK):
            ggopt_dequant_row(qtype, _row_at(sb, r // (n2 * n1) * s3 + r // n1 % n2 * s2
                                             + r % n1 * s1), db + r * ne0, nb, _vec)


def quantize_rows(const float[:, :, :, ::1] src not None, int qtype,
                  uint8_t[:, :, :, ::1] dst not None, int n_threads):
    """``dst`` = the blocks of ``src`` (ggml's quantize_row_*_ref, bit for bit).

    Parameters
    ----------
    src : (n3, n2, n1, ne0) float32, C-contiguous; ne0 a multiple of 32
    qtype : ggml type code
    dst : (n3, n2, n1, row bytes) uint8, C-contiguous, overwritten
    """
    cdef str fn = "quantize_rows"
    check_n_threads(fn, n_threads)
    if ggopt_q_block_bytes(qtype) and not ggopt_q_can_quantize(qtype):
        raise DTypeError(f"{fn}: type {qtype} is a K-quant, which ggopt dequantizes and computes "
                         "with but cannot quantize (no reference quantizer to match)")
    check_shape(fn, "dst's leading dims", dst.shape, 3, src.shape[0], src.shape[1], src.shape[2])
    cdef Py_ssize_t nb = _blocks_of_row(fn, qtype, dst.shape[3], src.shape[3])
    cdef Py_ssize_t ne0 = src.shape[3], rb = dst.shape[3]
    cdef Py_ssize_t nrows = src.shape[0] * src.shape[1] * src.shape[2], r
    if nrows == 0 or nb == 0:
        return
    cdef const float *sb = &src[0, 0, 0, 0]
    cdef uint8_t *db = &dst[0, 0, 0, 0]
    with nogil:
        for r in prange(nrows, schedule="static", num_threads=n_threads,
                        use_threads_if=nrows * ne0 >= MIN_PARALLEL_WORK):
            ggopt_quant_row(qtype, sb + r * ne0, db + r * rb, nb)


def get_quantized_rows(const uint8_t[:, :, :, :] a not None, int qtype,
                       const int32_t[:, :, ::1] idx not None, float[:, :, :, ::1] dst not None,
                       int n_threads):
    """Gather and dequantize rows: ``dst[i2, i1, i0, :] = deq(a[i2, i1, idx[i2, i1, i0]])``.

    Parameters
    ----------
    a : (ne3, ne2, ne1, row bytes) uint8, unit stride in a row
    idx : (ne3, ne2, I0) int32, C-contiguous, every entry in ``[0, ne1)`` (else ShapeError)
    dst : (ne3, ne2, I0, ne0) float32, C-contiguous, overwritten

    ggml: ggml_compute_forward_get_rows (quantized src0)
    """
    cdef str fn = "get_rows (ggml_get_rows)"
    check_n_threads(fn, n_threads)
    _check_unit(fn, "a", a.shape[3], a.strides[3], 1)
    check_shape(fn, "idx's leading dims", idx.shape, 2, a.shape[0], a.shape[1])
    check_shape(fn, "dst's leading dims", dst.shape, 3, a.shape[0], a.shape[1], idx.shape[2])
    cdef Py_ssize_t nb = _blocks_of_row(fn, qtype, a.shape[3], dst.shape[3])
    cdef Py_ssize_t I1 = idx.shape[1], I0 = idx.shape[2], ne0 = dst.shape[3]
    cdef Py_ssize_t nrows = idx.shape[0] * I1 * I0, r, i, v
    cdef const int32_t *ib = &idx[0, 0, 0] if nrows else NULL
    for i in range(nrows):
        v = ib[i]
        if v < 0 or v >= a.shape[2]:
            raise ShapeError(f"{fn}: idx[{i // (I1 * I0)}, {i // I0 % I1}, {i % I0}] = {v} is "
                             f"not a row index in [0, {a.shape[2]})")
    if nrows == 0 or nb == 0:
        return
    cdef const char *ab = <const char *>&a[0, 0, 0, 0]
    cdef Py_ssize_t s3 = a.strides[0], s2 = a.strides[1], s1 = a.strides[2]
    cdef float *db = &dst[0, 0, 0, 0]
    with nogil:
        for r in prange(nrows, schedule="static", num_threads=n_threads,
                        use_threads_if=nrows * ne0 >= MIN_PARALLEL_WORK):
            ggopt_dequant_row(qtype, _row_at(ab, r // (I1 * I0) * s3 + r // I0 % I1 * s2
                                             + ib[r] * s1), db + r * ne0, nb, _vec)


cdef int _check_ld(str fn, str name, Py_ssize_t rows, Py_ssize_t stride,
                   Py_ssize_t cols) except -1:
    """ShapeError unless a float32 matrix of ``rows`` rows of ``cols`` has a row stride BLAS
    takes: whole floats, at least a row apart (no overlap), within an int."""
    if rows > 1 and (stride % 4 or stride // 4 < cols or stride // 4 > 2147483647):
        raise ShapeError(f"{fn}: {name}'s rows of {cols} floats are {stride} bytes apart; "
                         "expected a multiple of 4 bytes, at least a row and below 2**31 floats")
    return 0


def mul_mat_quantized(const uint8_t[:, :] w not None, int qtype, const float[:, :] x not None,
                      float[:, :] out not None, int n_threads):
    """``out = x @ deq(w).T``: ggml's mul_mat of a quantized ``w`` (M rows of K) with ``x``.

    Panels of 48 weight rows are dequantized into a per-thread scratch and multiplied on one
    BLAS thread each; the panels depend only on the shapes.

    Parameters
    ----------
    w : (M, row bytes) uint8, unit stride in a row
    x : (N, K) float32, unit stride in a row
    out : (N, M) float32, unit stride in a row, overwritten
    """
    cdef str fn = "mul_mat (quantized src0)"
    check_n_threads(fn, n_threads)
    _check_unit(fn, "w", w.shape[1], w.strides[1], 1)
    _check_unit(fn, "x", x.shape[1], x.strides[1], 4)
    _check_unit(fn, "out", out.shape[1], out.strides[1], 4)
    cdef Py_ssize_t M = w.shape[0], N = x.shape[0], K = x.shape[1]
    check_shape(fn, "out", out.shape, 2, N, M)
    cdef Py_ssize_t nb = _blocks_of_row(fn, qtype, w.shape[1], K)
    _check_ld(fn, "x", N, x.strides[0], K)
    _check_ld(fn, "out", N, out.strides[0], M)
    cdef Py_ssize_t npanels = (M + PANEL_ROWS - 1) // PANEL_ROWS, p, i
    if N == 0 or M == 0:
        return
    cdef int ldx = <int>(x.strides[0] // 4) if N > 1 else <int>max(K, 1)
    cdef int ldo = <int>(out.strides[0] // 4) if N > 1 else <int>M
    cdef float *ob = &out[0, 0]
    if K == 0:
        for i in range(N):
            memset(ob + i * ldo, 0, M * sizeof(float))
        return
    cdef int team = <int>min(<Py_ssize_t>n_threads, npanels)
    cdef float *scratch = <float *>malloc(team * PANEL_ROWS * K * sizeof(float))
    if scratch == NULL:
        raise MemoryError(f"{fn}: out of memory for {team} panels of {PANEL_ROWS}x{K} floats")
    cdef const char *wb = <const char *>&w[0, 0]
    cdef Py_ssize_t ws = w.strides[0]
    cdef const float *xb = &x[0, 0]
    try:
        with nogil:
            for p in prange(npanels, schedule="static", chunksize=1, num_threads=team,
                            use_threads_if=team > 1):
                _mul_mat_panel(qtype, wb, ws, nb, p * PANEL_ROWS,
                               min(M, (p + 1) * PANEL_ROWS), K, N, xb, ldx, ob, ldo,
                               scratch + omp_get_thread_num() * PANEL_ROWS * K)
    finally:
        free(scratch)


cdef void _mul_mat_panel(int qtype, const char *wb, Py_ssize_t ws, Py_ssize_t nb, Py_ssize_t r0,
                         Py_ssize_t r1, Py_ssize_t K, Py_ssize_t N, const float *x, int ldx,
                         float *out, int ldo, float *scratch) noexcept nogil:
    """out[:, r0:r1] = x @ deq(w[r0:r1]).T; column-major: out^T = W_p (from its row-major
    copy, 'T') @ x^T ('N')."""
    cdef Py_ssize_t r
    for r in range(r0, r1):
        ggopt_dequant_row(qtype, <const uint8_t *>(wb + r * ws), scratch + (r - r0) * K, nb,
                          _vec)
    sgemm_colmajor(b'T', b'N', <int>(r1 - r0), <int>N, <int>K, scratch, <int>K, x, ldx,
                   out + r0, ldo)


def out_prod_quantized(const uint8_t[:, :] w not None, int qtype, const float[:, :] g not None,
                       float[:, :] out not None, int n_threads):
    """``out = g @ deq(w)``: ggml's out_prod of a quantized ``w`` (M rows of K) with
    ``g`` (N, M) — the gradient of mul_mat(w, x) with respect to ``x``.

    Panels of 3 block columns (96 elements; one 256-element super-block for the K-quants) of
    ``w`` are dequantized into a per-thread scratch and multiplied on one BLAS thread each. Over
    more than 4096 weight rows (an output head), each panel's sum is cut into chunks of 4096
    rows, computed as separate tasks (as many chunks at a time as give every thread one; only
    their partial sums are held) and added in chunk order; panels and chunks depend on the
    shapes alone, so the result does not depend on the thread count.

    Parameters
    ----------
    w : (M, row bytes) uint8, unit stride in a row
    g : (N, M) float32, unit stride in a row
    out : (N, K) float32, unit stride in a row, overwritten
    """
    cdef str fn = "out_prod (quantized src0)"
    check_n_threads(fn, n_threads)
    _check_unit(fn, "w", w.shape[1], w.strides[1], 1)
    _check_unit(fn, "g", g.shape[1], g.strides[1], 4)
    _check_unit(fn, "out", out.shape[1], out.strides[1], 4)
    cdef Py_ssize_t M = w.shape[0], N = g.shape[0], K = out.shape[1]
    check_shape(fn, "g", g.shape, 2, N, M)
    check_shape(fn, "out", out.shape, 2, N, K)
    cdef Py_ssize_t nb = _blocks_of_row(fn, qtype, w.shape[1], K)
    _check_ld(fn, "g", N, g.strides[0], M)
    _check_ld(fn, "out", N, out.strides[0], K)
    cdef Py_ssize_t rows = min(M, SUM_ROWS), nchunks = (M + rows - 1) // rows if M else 1
    cdef Py_ssize_t qk = ggopt_q_block_elems(qtype)
    cdef Py_ssize_t pb = PANEL_BLOCKS if nchunks == 1 else CHUNKED_PANEL_BLOCKS
    pb = max(1, pb * QK // qk)  # the K-quants: one 256-element super-block
    cdef Py_ssize_t npanels = (nb + pb - 1) // pb, p, i
    if N == 0 or K == 0:
        return
    cdef int ldg = <int>(g.strides[0] // 4) if N > 1 else <int>max(M, 1)
    cdef int ldo = <int>(out.strides[0] // 4) if N > 1 else <int>K
    cdef float *ob = &out[0, 0]
    if M == 0:
        for i in range(N):
            memset(ob + i * ldo, 0, K * sizeof(float))
        return
    # Tasks: (column panel, chunk of at most SUM_ROWS weight rows). One chunk: each panel
    # writes its columns of out. Several (the output head): the chunks go in groups of just
    # enough to give every thread a task; each task writes its partial product into its
    # chunk's slice of `part` (one group's), which is then added to out in chunk order.
    cdef Py_ssize_t group = min(nchunks, (n_threads + npanels - 1) // npanels)
    cdef Py_ssize_t ntasks = npanels * group, t, c, c0, cg, n, k
    cdef int team = <int>min(<Py_ssize_t>n_threads, ntasks)
    cdef Py_ssize_t panel = rows * pb * qk
    cdef float *scratch = <float *>malloc(team * panel * sizeof(float))
    cdef float *part = <float *>malloc(group * N * K * sizeof(float)) if nchunks > 1 else NULL
    cdef float *acc
    if scratch == NULL or (nchunks > 1 and part == NULL):
        free(scratch)
        free(part)
        raise MemoryError(f"{fn}: out of memory for {team} panels of {rows}x{pb * qk} "
                          f"floats and {group} partial sums of {N}x{K}")
    cdef const char *wb = <const char *>&w[0, 0]
    cdef Py_ssize_t ws = w.strides[0]
    cdef const float *gb = &g[0, 0]
    cdef int bb = ggopt_q_block_bytes(qtype)
    try:
        with nogil:
            c0 = 0
            while c0 < nchunks:
                cg = min(group, nchunks - c0)
                for t in prange(npanels * cg, schedule="static", chunksize=1,
                                num_threads=team, use_threads_if=team > 1):
                    p = t // cg
                    c = c0 + t % cg
                    _out_prod_panel(qtype, bb, qk, wb + c * rows * ws, ws,
                                    min(M - c * rows, rows), p * pb, min(nb, (p + 1) * pb), N,
                                    gb + c * rows, ldg,
                                    ob if nchunks == 1 else part + (c - c0) * N * K,
                                    ldo if nchunks == 1 else <int>K,
                                    scratch + omp_get_thread_num() * panel)
                if nchunks > 1:
                    for n in prange(N, schedule="static", num_threads=<int>min(
                            <Py_ssize_t>n_threads, N), use_threads_if=n_threads > 1 and N > 1):
                        acc = ob + n * ldo
                        for c in range(c0, c0 + cg):
                            if c == 0:
                                for k in range(K):
                                    acc[k] = part[n * K + k]
                            else:
                                for k in range(K):
                                    acc[k] += part[((c - c0) * N + n) * K + k]
                c0 = c0 + cg
    finally:
        free(scratch)
        free(part)


cdef void _out_prod_panel(int qtype, int bb, Py_ssize_t qk, const char *wb, Py_ssize_t ws,
                          Py_ssize_t M, Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t N,
                          const float *g, int ldg, float *out, int ldo,
                          float *scratch) noexcept nogil:
    """out[:, qk*b0 : qk*b1] = g @ deq(w[:, blocks b0:b1]); column-major: out_p^T = W_p^T
    (its row-major copy read as column-major, 'N') @ g^T ('N')."""
    cdef Py_ssize_t r, kp = (b1 - b0) * qk
    for r in range(M):
        ggopt_dequant_row(qtype, <const uint8_t *>(wb + r * ws + b0 * bb), scratch + r * kp,
                          b1 - b0, _vec)
    sgemm_colmajor(b'N', b'N', <int>kp, <int>N, <int>M, scratch, <int>kp, g, ldg,
                   out + b0 * qk, ldo)
