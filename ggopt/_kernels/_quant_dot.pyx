"""ggml's integer products of a quantized weight (its CPU backend's mul_mat): the activations
rounded to the weight type's vec_dot_type (Q8_0, Q8_1 or Q8_K, as ggml's x86
``quantize_row_q8_*``), integer sums per block, then the blocks' scales, added block after
block (``mul_mat_q8``; the rounding alone: ``quantize_activations``).

C in ``_quant_dot.h``: the activations' rounding, the packed weight panels, the AVX-512 VNNI
kernel, the AVX-VNNI and AVX2 ones (``_quant_avx2.h``, for CPUs without AVX-512 VNNI)
and the portable one; ``_quant_amx.h``: the AMX-INT8 kernel and the loop over a
thread's panels (the fastest kernel the CPU has is chosen at import; all give the same
bits). Shapes,
types and thread counts are checked before anything is written; every output is computed by
one thread in one order, so the results do not depend on ``n_threads``.
"""

from cython.parallel cimport prange
from libc.stdint cimport int8_t, int32_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from ggopt._kernels._common cimport check_n_threads, check_shape

from ggopt._kernels._openmp_helpers import min_parallel_work
from ggopt.errors import DTypeError, InvalidValueError, ShapeError

cdef extern from "_quant_dot.h" nogil:
    ctypedef struct ggopt_q8_rows:
        const int8_t *q
        const float *d
        const float *s
        const int32_t *sums
        Py_ssize_t K, nb
        int ggml_tiled
    int ggopt_q_block_bytes(int type)
    int ggopt_q_block_elems(int type)
    int ggopt_vec_dot_type(int wtype)
    int ggopt_cpu_has_vnni()
    int ggopt_cpu_has_avx2()
    int ggopt_cpu_has_avxvnni()
    void ggopt_q8_row(int vtype, const float *x, Py_ssize_t K, int bias, int8_t *q, float *d,
                      float *s, int32_t *sums, int kern)
    Py_ssize_t ggopt_packed_block_bytes(int wtype)
    void ggopt_pack_group(int wtype, const char *w, Py_ssize_t ws, int nrows, Py_ssize_t nb,
                          uint8_t *dst, int vec)

cdef extern from "_quant_amx.h" nogil:
    int ggopt_amx_init()
    Py_ssize_t ggopt_amx_rows(int wtype, Py_ssize_t N, int use_amx)
    Py_ssize_t ggopt_qdot_scratch_bytes(int wtype, Py_ssize_t nb, int packed)
    void ggopt_qdot_panels(int wtype, const uint8_t *packed, const char *w, Py_ssize_t ws,
                           Py_ssize_t M, const ggopt_q8_rows *x, Py_ssize_t N, float *out,
                           Py_ssize_t ldo, Py_ssize_t p0, Py_ssize_t p1, int kern,
                           int use_amx, char *scratch)

cdef enum:
    VD_Q8_1 = 9
    VD_Q8_K = 15
# Below this many elements the activations are rounded on the calling thread only.
cdef Py_ssize_t MIN_PARALLEL_WORK = min_parallel_work(1 << 14)


cdef int _check_unit(str fn, str name, Py_ssize_t n, Py_ssize_t stride,
                     Py_ssize_t itemsize) except -1:
    """ShapeError unless a row of ``n`` items has a unit stride (rows may be spaced freely)."""
    if n > 1 and stride != itemsize:
        raise ShapeError(f"{fn}: {name} needs a unit stride along its rows, got a stride of "
                         f"{stride} bytes")
    return 0


cdef Py_ssize_t _blocks_of_row(str fn, int qtype, Py_ssize_t row_bytes,
                               Py_ssize_t ne0) except -1:
    """Blocks per row, checking that ``row_bytes`` are exactly the blocks of ``ne0`` elements."""
    cdef Py_ssize_t qk = ggopt_q_block_elems(qtype), bb = ggopt_q_block_bytes(qtype)
    if ne0 % qk:
        raise ShapeError(f"{fn}: rows of {ne0} elements are not whole {qk}-element blocks")
    if row_bytes != ne0 // qk * bb:
        raise ShapeError(f"{fn}: a row of {ne0} elements of type {qtype} is {ne0 // qk * bb} "
                         f"bytes ({ne0 // qk} blocks of {bb}), the raw rows have {row_bytes}")
    return ne0 // qk

# The integer products: AMX-INT8 for each whole 16 activation rows (not Q6_K) and
# AVX-512 VNNI for the rest when the CPU (and the OS) have them, else AVX-VNNI or AVX2
# (_quant_avx2.h), unless a slower kernel is chosen (the same bits; for tests and
# measurements). _kern: the kernel of the rows AMX does not take (GGOPT_KERN_*).
cdef int _HAS_VNNI = ggopt_cpu_has_vnni()
cdef int _HAS_AMX = _HAS_VNNI and ggopt_amx_init()
cdef int _HAS_AVXVNNI = ggopt_cpu_has_avxvnni()
cdef int _HAS_AVX2 = ggopt_cpu_has_avx2()
# kernel names by GGOPT_KERN_* id, and the ids of the kernels this CPU has, fastest first
_KERNS = ("portable", "vnni", "avx2", "avxvnni")
_FOUND = [i for i, has in ((1, _HAS_VNNI), (3, _HAS_AVXVNNI), (2, _HAS_AVX2)) if has] + [0]
cdef int _kern = _FOUND[0]
cdef int _use_amx = _HAS_AMX
# weight rows per panel of mul_mat_q8 (two packed groups of 16)
cdef Py_ssize_t Q8_PANEL = 32


def vnni_kernel() -> bool:
    """True when mul_mat_q8 runs its AVX-512 VNNI kernel (the CPU has it, not forced off)."""
    return _kern == 1


def force_portable(bint on) -> None:
    """Make mul_mat_q8 use its portable kernel (same results; for tests and measurements);
    False: the fastest kernel again."""
    set_kernel("portable" if on else "auto")


def kernel() -> str:
    """The kernel mul_mat_q8 runs on 16 or more activation rows: "amx", "vnni", "avxvnni",
    "avx2" or "portable"."""
    return "amx" if _use_amx else _KERNS[_kern]


def set_kernel(str name) -> None:
    """Choose mul_mat_q8's kernel: "auto" (the fastest this CPU has), "amx" (AMX-INT8 for each
    16 activation rows, VNNI for the rest), "vnni" (AVX-512 VNNI), "avxvnni" (AVX-VNNI),
    "avx2" or "portable"; all give the same bits (ggml's tiled order runs on AVX-VNNI when
    chosen, else on AVX2, and not with "portable"). InvalidValueError for an unknown name or one
    this CPU lacks, before anything changes."""
    global _kern, _use_amx
    has = {"auto": True, "amx": _HAS_AMX, "vnni": _HAS_VNNI, "avxvnni": _HAS_AVXVNNI,
           "avx2": _HAS_AVX2, "portable": True}
    if name not in has:
        raise InvalidValueError(f"set_kernel: unknown kernel {name!r}; expected one of "
                                f"{', '.join(has)}")
    if not has[name]:
        raise InvalidValueError(f"set_kernel: this CPU (or OS) has no {name} kernel; available: "
                                f"{', '.join(available())}")
    _use_amx = _HAS_AMX and name in ("auto", "amx")
    _kern = _FOUND[0] if name in ("auto", "amx") else _KERNS.index(name)


def has_ggml_tiled(int qtype) -> bool:
    """True when :func:`mul_mat_q8` can round a ``qtype`` weight's products in ggml's tiled
    order: a K-quant (Q2_K ... Q6_K), on a CPU with AVX2 and the portable kernel not forced."""
    return 10 <= qtype <= 14 and _HAS_AVX2 and _kern != 0


def available() -> list[str]:
    """The kernels this CPU can run, fastest first."""
    return ["amx"] * _HAS_AMX + [_KERNS[i] for i in _FOUND]


cdef int _vec_dot_type(str fn, int qtype) except -1:
    cdef int vt = ggopt_vec_dot_type(qtype)
    if vt == 0:
        raise DTypeError(f"{fn}: type {qtype} has no integer product (expected Q4_0=2, Q4_1=3, "
                         "Q5_0=6, Q5_1=7, Q8_0=8, Q2_K=10, Q3_K=11, Q4_K=12, Q5_K=13, Q6_K=14)")
    return vt


def quantize_activations(const float[:, :] x not None, int qtype, int8_t[:, ::1] q not None,
                         float[:, ::1] d not None, float[:, ::1] s not None,
                         int32_t[:, ::1] sums not None, int n_threads):
    """Round the rows of ``x`` (N, K) to the vec_dot_type of weight type ``qtype`` as ggml's
    x86 ``quantize_row_q8_0/q8_1/q8_K`` do: ``q`` (N, K) the int8 codes (plus 128, as uint8
    bits, for a Q8_0 weight), ``d`` (N, blocks) the scales (Q8_0/Q8_1: the F16 d's value;
    Q8_K: F32), ``s`` (N, K/32) Q8_1's F16 s (untouched for the other types), ``sums``
    (N, K/16) the sums of each 16 codes."""
    cdef str fn = "quantize_activations"
    check_n_threads(fn, n_threads)
    cdef int vt = _vec_dot_type(fn, qtype)
    _check_unit(fn, "x", x.shape[1], x.strides[1], 4)
    cdef Py_ssize_t N = x.shape[0], K = x.shape[1], qb = 256 if vt == VD_Q8_K else 32, n
    if K % qb:
        raise ShapeError(f"{fn}: rows of {K} elements are not whole {qb}-element blocks")
    check_shape(fn, "q", q.shape, 2, N, K)
    check_shape(fn, "d", d.shape, 2, N, K // qb)
    check_shape(fn, "sums", sums.shape, 2, N, K // 16)
    if vt == VD_Q8_1:
        check_shape(fn, "s", s.shape, 2, N, K // 32)
    if N == 0 or K == 0:
        return
    cdef const char *xb = <const char *>&x[0, 0]
    cdef Py_ssize_t xs = x.strides[0]
    cdef int bias = qtype == 8
    with nogil:
        for n in prange(N, schedule="static", num_threads=n_threads,
                        use_threads_if=N * K >= MIN_PARALLEL_WORK):
            ggopt_q8_row(vt, <const float *>(xb + n * xs), K, bias, &q[n, 0], &d[n, 0],
                         &s[n, 0] if vt == VD_Q8_1 else NULL, &sums[n, 0], _kern)


def packed_shape(int qtype, Py_ssize_t rows, Py_ssize_t cols) -> tuple[int, int]:
    """The shape of :func:`pack_weight`'s panels for ``rows`` x ``cols`` weights of ``qtype``:
    (panels of 32 rows, bytes per panel)."""
    cdef str fn = "packed_shape"
    _vec_dot_type(fn, qtype)
    cdef Py_ssize_t qk = ggopt_q_block_elems(qtype)
    if rows < 0 or cols < 0 or cols % qk:
        raise ShapeError(f"{fn}: {rows} x {cols} is not rows of whole {qk}-element blocks")
    return ((rows + Q8_PANEL - 1) // Q8_PANEL,
            2 * ggopt_packed_block_bytes(qtype) * (cols // qk))


def pack_weight(const uint8_t[:, :] w not None, int qtype, uint8_t[:, ::1] panels not None,
                int n_threads):
    """Decode the weight rows of ``w`` (M, row bytes) once into the panels :func:`mul_mat_q8`
    multiplies (``panels`` of :func:`packed_shape`; rows past M zero), for a weight that does
    not change: pass them as ``mul_mat_q8(..., packed=panels)``."""
    cdef str fn = "pack_weight"
    check_n_threads(fn, n_threads)
    _vec_dot_type(fn, qtype)
    _check_unit(fn, "w", w.shape[1], w.strides[1], 1)
    cdef Py_ssize_t M = w.shape[0], bb = ggopt_q_block_bytes(qtype), p
    if w.shape[1] % bb:
        raise ShapeError(f"{fn}: rows of {w.shape[1]} bytes are not whole {bb}-byte blocks "
                         f"of type {qtype}")
    cdef Py_ssize_t nb = w.shape[1] // bb
    cdef Py_ssize_t gbytes = ggopt_packed_block_bytes(qtype) * nb
    check_shape(fn, "panels", panels.shape, 2, (M + Q8_PANEL - 1) // Q8_PANEL, 2 * gbytes)
    if M == 0 or nb == 0:
        return
    cdef const char *wb = <const char *>&w[0, 0]
    cdef Py_ssize_t ws = w.strides[0]
    cdef int ml, vec = _kern != 0  # AVX2 decoding, except for the portable kernel
    with nogil:
        for p in prange(panels.shape[0], schedule="static", num_threads=n_threads,
                        use_threads_if=n_threads > 1 and M * nb >= 64):
            ml = <int>min(Q8_PANEL, M - p * Q8_PANEL)
            ggopt_pack_group(qtype, wb + p * Q8_PANEL * ws, ws, min(ml, 16), nb, &panels[p, 0],
                             vec)
            ggopt_pack_group(qtype, wb + (p * Q8_PANEL + 16) * ws, ws, max(ml - 16, 0), nb,
                             &panels[p, gbytes], vec)


def mul_mat_q8(const uint8_t[:, :] w not None, int qtype, const float[:, :] x not None,
               float[:, :] out not None, int n_threads, const uint8_t[:, ::1] packed=None,
               bint ggml_tiled=False):
    """``out = x @ W.T`` as ggml's CPU backend computes mul_mat of a quantized ``w`` (M rows of
    K): ``x`` rounded to the type's vec_dot_type (:func:`quantize_activations`), integer sums
    per block, then the blocks' scales, added block after block.

    Each thread takes a range of the panels of 32 weight rows, packed into its scratch (or
    taken from ``packed``), and multiplies them against all of ``x`` (AMX-INT8, AVX-512 VNNI
    or the portable kernel: the same bits); every output is summed in the same order whichever
    thread computes it.

    Parameters
    ----------
    w : (M, row bytes) uint8, unit stride in a row
    x : (N, K) float32, unit stride in a row
    out : (N, M) float32, unit stride in a row, overwritten
    packed : :func:`pack_weight`'s panels of this ``w`` (the caller keeps them matched), or None
    ggml_tiled : a K-quant's block sums rounded in ggml's tiled order (``_ggml_order_k.h``)
        instead of ggopt's; this runs the AVX-VNNI kernel when it is the chosen one, else the
        AVX2 kernel (never AMX, AVX-512 VNNI or the portable one; :func:`has_ggml_tiled`)
    """
    cdef str fn = "mul_mat (quantized src0, integer product)"
    check_n_threads(fn, n_threads)
    cdef int vt = _vec_dot_type(fn, qtype)
    if ggml_tiled and not has_ggml_tiled(qtype):
        raise InvalidValueError(f"{fn}: ggml's tiled order is for Q2_K ... Q6_K weights on a "
                                f"CPU with AVX2, the portable kernel not forced; got type "
                                f"{qtype} on {kernel()!r}")
    _check_unit(fn, "w", w.shape[1], w.strides[1], 1)
    _check_unit(fn, "x", x.shape[1], x.strides[1], 4)
    _check_unit(fn, "out", out.shape[1], out.strides[1], 4)
    cdef Py_ssize_t M = w.shape[0], N = x.shape[0], K = x.shape[1]
    check_shape(fn, "out", out.shape, 2, N, M)
    cdef Py_ssize_t nb = _blocks_of_row(fn, qtype, w.shape[1], K)
    cdef Py_ssize_t npanels = (M + Q8_PANEL - 1) // Q8_PANEL, t, i, n
    cdef Py_ssize_t gbytes = ggopt_packed_block_bytes(qtype) * nb
    if packed is not None:
        check_shape(fn, "packed", packed.shape, 2, npanels, 2 * gbytes)
    if N == 0 or M == 0:
        return
    cdef Py_ssize_t ldo = out.strides[0] // 4 if N > 1 else M
    cdef float *ob = &out[0, 0]
    if K == 0:
        for i in range(N):
            memset(ob + i * ldo, 0, M * sizeof(float))
        return
    cdef Py_ssize_t nb32 = K // 32
    cdef int8_t *aq = <int8_t *>malloc(N * K)
    cdef float *ad = <float *>malloc(N * nb32 * sizeof(float))
    cdef float *as_ = <float *>malloc(N * nb32 * sizeof(float)) if vt == VD_Q8_1 else NULL
    cdef int32_t *asums = <int32_t *>malloc(N * (K // 16) * sizeof(int32_t))
    cdef int team = <int>min(<Py_ssize_t>n_threads, npanels)
    cdef const uint8_t *pk = &packed[0, 0] if packed is not None else NULL
    cdef Py_ssize_t tbytes = ggopt_qdot_scratch_bytes(qtype, nb, pk != NULL)
    cdef char *scratch = <char *>malloc(team * tbytes)
    if aq == NULL or ad == NULL or asums == NULL or scratch == NULL or (
            vt == VD_Q8_1 and as_ == NULL):
        free(aq)
        free(ad)
        free(as_)
        free(asums)
        free(scratch)
        raise MemoryError(f"{fn}: out of memory for the {N}x{K} quantized activations and "
                          f"{team} packed panels of {gbytes * 2} bytes")
    cdef ggopt_q8_rows rows
    rows.q = aq
    rows.d = ad
    rows.s = as_
    rows.sums = asums
    rows.K = K
    rows.nb = nb
    rows.ggml_tiled = ggml_tiled
    cdef const char *xb = <const char *>&x[0, 0]
    cdef Py_ssize_t xs = x.strides[0]
    cdef const char *wb = <const char *>&w[0, 0]
    cdef Py_ssize_t ws = w.strides[0]
    cdef int bias = qtype == 8, kern = _kern, use_amx = _use_amx and not ggml_tiled
    if ggml_tiled and kern != 3:  # the AVX2 kernel, or AVX-VNNI's: the same integers
        kern = 2
    cdef Py_ssize_t qb = K // nb
    # a Q8_0 weight's activations: signed codes for the AMX kernel's rows, biased for the rest
    cdef Py_ssize_t namx = ggopt_amx_rows(qtype, N, use_amx)
    try:
        with nogil:
            for n in prange(N, schedule="static", num_threads=n_threads,
                            use_threads_if=N * K >= MIN_PARALLEL_WORK):
                ggopt_q8_row(vt, <const float *>(xb + n * xs), K, bias and n >= namx,
                             aq + n * K, ad + n * (K // qb),
                             as_ + n * nb32 if vt == VD_Q8_1 else NULL, asums + n * (K // 16),
                             kern)
            for t in prange(team, schedule="static", chunksize=1, num_threads=team,
                            use_threads_if=team > 1):
                ggopt_qdot_panels(qtype, pk, wb, ws, M, &rows, N, ob, ldo, t * npanels // team,
                                  (t + 1) * npanels // team, kern, use_amx,
                                  scratch + t * tbytes)
    finally:
        free(aq)
        free(ad)
        free(as_)
        free(asums)
        free(scratch)
