"""Thin matrix products without BLAS: ``out = x @ y`` (or ``acc += x @ y``) where one of the
three sides is at most THIN_MAX_SIDE (a rank-r LoRA adapter's ``A x``, ``B h`` and their
gradients).

Such products are memory-bound and short (10-150 us); one-thread ``sgemm`` spends most of that
packing and in its edge kernels (13-30 GFLOP/s on SmolLM2's adapters). A :class:`ThinPlan` holds
a fixed list of them and computes each in one of two forms, chosen from the shapes and strides
(the product or its transpose ``out^T = y^T x^T``, whichever fits):

- **rows** (``y`` read along its rows, unit stride): ``out[i, j] = x[i, 0] y[0, j] + x[i, 1]
  y[1, j] + ...``, one running sum per output, ``k`` ascending, 16 outputs of a row per vector;
  for a short reduction (``B h``: K = r) or few rows (the gradients ``dh^T x``, ``dy^T h``).
  A ``y`` without a unit stride along its rows is first copied, the columns of one block at a
  time, into a per-thread scratch.
- **dots** (``x`` and ``y^T`` read along the reduction, at most THIN_MAX_SIDE columns):
  ``out[i, c]`` is ``x[i] . y[:, c]`` with 16 running sums (element ``k`` to sum ``k % 16``)
  added pairwise at the end, exactly GemmPlan's one-token dot products; for ``A x`` and
  ``B^T dy``. A ``y`` whose columns are not contiguous is copied to a scratch first.

With ``acc`` the sum of each output is added to ``acc`` (``acc + s``, one rounding, as an add
after the product) and ``out`` is not written: the fused ``W x + B h`` and gradient sums of
``backend/fusion.py``. Every output is computed whole by one thread in a fixed order that
depends only on its own row and column of the operands, so the bits do not depend on the thread
count or on how the work is cut (blocks of the long sides, from the shapes alone). The order is
not sgemm's: results agree with it to float rounding, not bit for bit. No FMA (setup.py).
"""

from cython.parallel cimport prange
from libc.stdlib cimport free, malloc, realloc

from ggopt._kernels._common cimport check_n_threads, ggopt_cpu_narrow
from ggopt._kernels._openmp cimport omp_get_thread_num

import operator

from ggopt._kernels._openmp_helpers import min_parallel_work

from ggopt.errors import ShapeError

# A product is thin when a side is at most this many; the kernels' register tiles are made for
# sides of 1-16 (LoRA ranks up to 16).
cdef Py_ssize_t THIN_MAX_SIDE = 16
# Products of at most this many rows with x and y^T contiguous along the reduction stay on
# GemmPlan's dot-product kernel, which shares one product's weight columns out over the threads
# (a token's activations against a weight: generation).
cdef Py_ssize_t ONE_TOKEN_ROWS = 4
# The rows form's blocks are at most this many columns wide (their running sums, 8 rows of
# them, stay in the first-level cache).
cdef Py_ssize_t ROWS_MAX_COLS = 512
# Multiply-adds per block of work shared out over the threads (about 15 us on one core).
cdef Py_ssize_t BLOCK_MACS = 1 << 19
# A plan of fewer multiply-adds runs on the calling thread alone (scaled up where idle threads
# sleep at once). With idle threads spinning (wait_policy.py) two threads take 0.5-0.65x a
# rank-8 adapter's time (B h + add, 1536 x 256: 254 -> 166 us), but where another process
# holds a core each parallel region can wait about 1 ms for its second thread. SmolLM2's LoRA
# step (AMD EPYC Zen 3, 2 threads, medians, 2026-12-05): at this threshold, which takes the
# 1536-wide adapters (3.1M) and leaves the 576-wide (1.2M), 1.20 -> 1.15 s, and 3.28 -> 3.44 s
# beside a process spinning on one core; everything parallel 1.20 -> 1.12 s but 3.42 -> 4.18 s.
cdef Py_ssize_t DEFAULT_PARALLEL_MIN_MACS = min_parallel_work(2 << 20)
cdef Py_ssize_t PARALLEL_MIN_MACS = DEFAULT_PARALLEL_MIN_MACS


def set_parallel_min(macs):
    """Run plans of fewer than ``macs`` multiply-adds on one thread (None: the default; for
    benchmarks and tests: the results are the same bits either way)."""
    global PARALLEL_MIN_MACS
    PARALLEL_MIN_MACS = DEFAULT_PARALLEL_MIN_MACS if macs is None else operator.index(macs)


def set_block_macs(Py_ssize_t macs):
    """The multiply-adds per block of work in plans built from now on (for tests: any cut
    gives the same bits)."""
    global BLOCK_MACS
    BLOCK_MACS = max(macs, 1)


cdef extern from "_thin_kernels.h" nogil:
    void thin_rows(const float *x, Py_ssize_t xs0, Py_ssize_t xs1, const float *y,
                   Py_ssize_t ys0, Py_ssize_t k, Py_ssize_t nr, Py_ssize_t nc, float *dst,
                   Py_ssize_t ds0, Py_ssize_t ds1, int add, float *part, Py_ssize_t ldp,
                   int padded, int narrow) noexcept
    void thin_dots(const float *x, Py_ssize_t xs0, const float *yt, Py_ssize_t ys0,
                   Py_ssize_t k, Py_ssize_t nr, Py_ssize_t nc, float *dst, Py_ssize_t ds0,
                   Py_ssize_t ds1, int add, int narrow) noexcept
    void thin_pack(float *dst, Py_ssize_t ld, const float *src, Py_ssize_t s0, Py_ssize_t s1,
                   Py_ssize_t n0, Py_ssize_t n1) noexcept

# The narrow register tiles (a CPU without AVX-512: _thin_kernels.h); the same bits either way.
cdef int NARROW = ggopt_cpu_narrow()


def set_narrow_tiles(narrow):
    """Force the narrow register tiles (True), the wide ones (False) or this CPU's choice
    (None) (for tests: the same bits either way). Returns the setting now in use."""
    global NARROW
    NARROW = ggopt_cpu_narrow() if narrow is None else bool(narrow)
    return bool(NARROW)


cdef enum:
    FORM_ROWS = 0
    FORM_DOTS = 1


cdef struct Thin:
    int form
    bint pack         # y (rows form) or y^T (dots form) copied to the scratch first
    Py_ssize_t r, k, c
    const float *x
    Py_ssize_t xs0, xs1   # element strides of x (r, k)
    const float *y
    Py_ssize_t ys0, ys1   # of y (k, c)
    float *dst            # out, or acc when add
    Py_ssize_t ds0, ds1
    bint add
    bint transposed       # computed as out^T = y^T x^T


cdef struct Block:
    Py_ssize_t product
    Py_ssize_t r0, r1, c0, c1


cdef struct Oriented:
    Py_ssize_t r, k, c, xs0, xs1, ys0, ys1


cdef int _form(const Oriented *o) noexcept:
    """How good a form fits this orientation: 0 dots in place, 1 rows in place, 2 dots packed,
    3 rows packed, 9 none."""
    cdef bint dots = o.xs1 == 1 or o.k <= 1
    if dots and o.c <= THIN_MAX_SIDE and (o.ys0 == 1 or o.k <= 1):
        return 0
    if o.c >= 16 and o.ys1 == 1:
        return 1
    if dots and o.c <= THIN_MAX_SIDE and o.r >= 16:
        return 2
    if o.c >= 16 and o.r >= 16:
        return 3
    return 9


cdef Py_ssize_t _elements(Py_ssize_t stride) noexcept:
    return stride // 4 if stride >= 0 and stride % 4 == 0 else -1


cdef class ThinPlan:
    """Thin products ``out = x @ y`` (or ``acc += x @ y``), run by :meth:`run` on up to
    ``n_threads`` threads; the arrays are referenced, not copied."""

    cdef Thin *products
    cdef Py_ssize_t n_products
    cdef Block *blocks
    cdef Py_ssize_t n_blocks
    cdef Py_ssize_t scratch  # floats of copied operand per thread
    cdef Py_ssize_t macs
    cdef list keep

    def __cinit__(self):
        self.products = NULL
        self.blocks = NULL
        self.n_products = 0
        self.n_blocks = 0
        self.scratch = 0
        self.macs = 0
        self.keep = []

    def __dealloc__(self):
        free(self.products)
        free(self.blocks)

    @property
    def n_items(self) -> int:
        """How many products the plan runs."""
        return self.n_products

    @property
    def n_work(self) -> int:
        """How many blocks of work the threads share out."""
        return self.n_blocks

    def forms(self) -> list[str]:
        """Each product's form: ``"rows"``/``"dots"``, ``"+packed"`` when an operand is copied
        first, ``"^T"`` when computed as the transposed product (for tests)."""
        return [self._describe(i) for i in range(self.n_products)]

    def add(self, const float[:, :] x not None, const float[:, :] y not None,
            float[:, :] out not None, float[:, :] acc=None) -> bool:
        """Append ``out = x @ y``, or ``acc += x @ y`` when ``acc`` is given (``out`` then
        unwritten); False, and nothing appended, when the product is not thin or no form reads
        its operands well (the caller uses GemmPlan)."""
        cdef Py_ssize_t r = x.shape[0], k = x.shape[1], c = y.shape[1]
        if y.shape[0] != k or out.shape[0] != r or out.shape[1] != c:
            raise ShapeError(f"ThinPlan.add: x ({r}, {k}) @ y ({y.shape[0]}, {c}) does not "
                             f"give out ({out.shape[0]}, {out.shape[1]})")
        if acc is not None and (acc.shape[0] != r or acc.shape[1] != c):
            raise ShapeError(f"ThinPlan.add: acc ({acc.shape[0]}, {acc.shape[1]}) is not the "
                             f"shape of out ({r}, {c})")
        if min(r, k, c) > THIN_MAX_SIDE:
            return False
        cdef Oriented o, t
        o.r, o.k, o.c = r, k, c
        o.xs0, o.xs1 = _elements(x.strides[0]), _elements(x.strides[1])
        o.ys0, o.ys1 = _elements(y.strides[0]), _elements(y.strides[1])
        cdef float[:, :] dst = out if acc is None else acc
        cdef Py_ssize_t ds0 = _elements(dst.strides[0]), ds1 = _elements(dst.strides[1])
        if min(o.xs0, o.xs1, o.ys0, o.ys1, ds0, ds1) < 0:
            return False
        if r <= ONE_TOKEN_ROWS and o.xs1 == 1 and o.ys0 == 1 and c > THIN_MAX_SIDE:
            return False  # GemmPlan's dot products (see ONE_TOKEN_ROWS)
        t.r, t.k, t.c = c, k, r  # out^T = y^T x^T
        t.xs0, t.xs1, t.ys0, t.ys1 = o.ys1, o.ys0, o.xs1, o.xs0
        cdef int fo = _form(&o), ft = _form(&t)
        if r == 0 or k == 0 or c == 0:
            fo = 1  # nothing to read: out is empty or zeros
        if min(fo, ft) == 9:
            return False
        cdef Thin p
        p.add = acc is not None
        p.transposed = fo > ft
        if fo <= ft:
            p.r, p.k, p.c, p.x, p.y = r, k, c, &x[0, 0] if r and k else NULL, \
                &y[0, 0] if k and c else NULL
            p.xs0, p.xs1, p.ys0, p.ys1, p.ds0, p.ds1 = o.xs0, o.xs1, o.ys0, o.ys1, ds0, ds1
        else:
            fo = ft
            p.r, p.k, p.c, p.x, p.y = c, k, r, &y[0, 0] if k and c else NULL, \
                &x[0, 0] if r and k else NULL
            p.xs0, p.xs1, p.ys0, p.ys1, p.ds0, p.ds1 = t.xs0, t.xs1, t.ys0, t.ys1, ds1, ds0
        p.dst = &dst[0, 0] if r and c else NULL
        p.form = FORM_DOTS if fo in (0, 2) else FORM_ROWS
        p.pack = fo >= 2
        self._append(p)
        self.keep += [x, y, out, acc]
        return True

    cdef int _append(self, Thin p) except -1:
        cdef Py_ssize_t n_r = 1, n_c = 1, want, i, j, step_c, step_r
        if p.r == 0 or p.c == 0:
            return 0  # nothing to write
        want = max(1, min(64, p.r * p.k * p.c // BLOCK_MACS))
        if p.form == FORM_ROWS:  # column blocks of whole vectors, then row blocks of 8
            n_c = max(min(want, (p.c + 15) // 16), (p.c + ROWS_MAX_COLS - 1) // ROWS_MAX_COLS)
            n_r = min((want + n_c - 1) // n_c, (p.r + 7) // 8)
            step_c = (p.c + 16 * n_c - 1) // (16 * n_c) * 16
            step_r = (p.r + 8 * n_r - 1) // (8 * n_r) * 8
            self.scratch = max(self.scratch, (p.k * step_c if p.pack else 0) + 8 * step_c)
        else:  # row blocks of 2
            n_r = min(want, (p.r + 1) // 2)
            step_r = (p.r + 2 * n_r - 1) // (2 * n_r) * 2
            step_c = p.c
            if p.pack:
                self.scratch = max(self.scratch, p.k * p.c)
        cdef Thin *grown = <Thin *>realloc(self.products, (self.n_products + 1) * sizeof(Thin))
        if grown == NULL:
            raise MemoryError("ThinPlan.add: out of memory")
        self.products = grown
        cdef Py_ssize_t more = ((p.r + step_r - 1) // step_r) * ((p.c + step_c - 1) // step_c)
        cdef Block *blocks = <Block *>realloc(self.blocks,
                                              (self.n_blocks + more) * sizeof(Block))
        if blocks == NULL:
            raise MemoryError("ThinPlan.add: out of memory")
        self.blocks = blocks
        for i in range(0, p.r, step_r):
            for j in range(0, p.c, step_c):
                self.blocks[self.n_blocks] = Block(self.n_products, i, min(i + step_r, p.r),
                                                   j, min(j + step_c, p.c))
                self.n_blocks += 1
        self.products[self.n_products] = p
        self.n_products += 1
        self.macs += p.r * p.k * p.c
        return 0

    cdef str _describe(self, Py_ssize_t i):
        cdef Thin *p = &self.products[i]
        return (("dots" if p.form == FORM_DOTS else "rows") + ("+packed" if p.pack else "")
                + ("^T" if p.transposed else ""))

    def run(self, int n_threads) -> None:
        """Compute every product (on up to ``n_threads`` threads)."""
        check_n_threads("ThinPlan.run", n_threads)
        cdef Py_ssize_t i
        cdef int team = <int>min(<Py_ssize_t>n_threads, self.n_blocks)
        if self.macs < PARALLEL_MIN_MACS:
            team = 1
        cdef float *scratch = NULL
        cdef Py_ssize_t *packed = <Py_ssize_t *>malloc(max(team, 1) * sizeof(Py_ssize_t))
        if packed == NULL:
            raise MemoryError("ThinPlan.run: out of memory")
        for i in range(max(team, 1)):
            packed[i] = -1
        if self.scratch:
            scratch = <float *>malloc(max(team, 1) * self.scratch * sizeof(float))
            if scratch == NULL:
                free(packed)
                raise MemoryError("ThinPlan.run: out of memory for copied operands")
        cdef int t
        with nogil:
            if team > 1:
                for i in prange(self.n_blocks, num_threads=team, schedule="dynamic"):
                    t = omp_get_thread_num()
                    _block(self.products, &self.blocks[i], scratch + t * self.scratch,
                           &packed[t])
            else:
                for i in range(self.n_blocks):
                    _block(self.products, &self.blocks[i], scratch, packed)
        free(scratch)
        free(packed)


cdef void _block(const Thin *products, const Block *b, float *scratch,
                 Py_ssize_t *packed) noexcept nogil:
    """One block of a product; ``packed``: which product's y^T the thread's scratch holds (the
    dots form copies it once per thread, not per block)."""
    cdef const Thin *p = &products[b.product]
    cdef Py_ssize_t nr = b.r1 - b.r0, nc = b.c1 - b.c0, ld = (nc + 15) // 16 * 16
    cdef float *dst = p.dst + b.r0 * p.ds0 + b.c0 * p.ds1
    cdef const float *x
    cdef const float *y
    if p.k == 0 or p.x == NULL or p.y == NULL:  # an empty sum
        _zero(dst, p.ds0, p.ds1, nr, nc, p.add)
        return
    x = p.x + b.r0 * p.xs0
    if p.form == FORM_ROWS:  # packs per block, and its running sums use the scratch too
        packed[0] = -1
        y = p.y + b.c0 * p.ys1
        if p.pack:
            thin_pack(scratch, ld, y, p.ys0, p.ys1, p.k, nc)
            thin_rows(x, p.xs0, p.xs1, scratch, ld, p.k, nr, nc, dst, p.ds0, p.ds1, p.add,
                      scratch + p.k * ld, ld, 1, NARROW)
        else:
            thin_rows(x, p.xs0, p.xs1, y, p.ys0, p.k, nr, nc, dst, p.ds0, p.ds1, p.add,
                      scratch, ld, 0, NARROW)
    elif p.pack:  # y^T (c, k) contiguous
        if packed[0] != b.product:
            thin_pack(scratch, p.k, p.y, p.ys1, p.ys0, p.c, p.k)
            packed[0] = b.product
        thin_dots(x, p.xs0, scratch, p.k, p.k, nr, p.c, dst, p.ds0, p.ds1, p.add, NARROW)
    else:
        thin_dots(x, p.xs0, p.y, p.ys1, p.k, nr, p.c, dst, p.ds0, p.ds1, p.add, NARROW)


cdef void _zero(float *dst, Py_ssize_t s0, Py_ssize_t s1, Py_ssize_t n0, Py_ssize_t n1,
                bint add) noexcept nogil:
    """An empty sum: out = 0, or acc = acc + 0 (as an add of the zero product would)."""
    cdef Py_ssize_t i, j
    for i in range(n0):
        for j in range(n1):
            dst[i * s0 + j * s1] = dst[i * s0 + j * s1] + <float>0.0 if add else 0.0
