"""Matrix products on BLAS ``sgemm``: one-thread calls spread over an OpenMP team.

A :class:`GemmPlan` is a fixed list of row-major float32 products ``out = x @ y`` whose
operands are 2-D views with a unit stride on one axis (each optionally followed, on the same
thread while ``out`` is still in cache, by ``acc += out``), plus split-K partials to add once
the products are done. :meth:`GemmPlan.run` calls SciPy's BLAS ``sgemm``
(``scipy.linalg.cython_blas``) for each product with the GIL released, on up to ``n_threads``
OpenMP threads. The caller holds BLAS at one thread (``backend/blas.py``), so every product is
the same single-threaded call whichever thread runs it: the result does not depend on the
thread count. The products are cut by the caller from the shapes alone (``cpu_ops/linalg.py``).

Products of one token (at most DOT_MAX_ROWS rows) against a weight stored row by row skip BLAS:
``ggopt_dot_rows`` computes blocks of their output columns, the blocks shared out over the
threads, each output a dot product in a fixed order of its own (so again the same bits for any
thread count).

BLAS is column-major: the row-major ``out (r, c) = x (r, k) @ y (k, c)`` is computed as the
column-major ``out^T (c, r) = y^T (c, k) @ x^T (k, r)``.
"""

from cython.parallel cimport prange
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memset

from scipy.linalg.cython_blas cimport sgemm

from ggopt._kernels._common cimport check_n_threads, ggopt_cpu_favours_mkl, ggopt_cpu_narrow
from ggopt._kernels._openmp cimport omp_get_thread_num

from ggopt._kernels._openmp_helpers import min_parallel_work

from ggopt.errors import ShapeError

cdef enum:
    _INT_MAX = 2147483647

# When x is row-major and y^T is stored transposed (sgemm 'T','N': every mul_mat of ggml, whose
# rows are contiguous along the reduction), y^T is first copied to a column-major scratch and
# the product called as 'N','N', if y has at most PACK_MAX_ELEMENTS elements and the product
# at least PACK_MIN_ROWS rows: OpenBLAS's small 'T','N' products ran 1.3-1.8x slower than
# 'N','N' ones (attention's per-head products), and the copy costs 1 / rows of the product.
cdef Py_ssize_t PACK_MAX_ELEMENTS = 1 << 16
cdef Py_ssize_t PACK_MIN_ROWS = 16


# A product of at most DOT_MAX_ROWS rows (one token's activations, or a few) with y^T stored
# transposed (a weight's rows contiguous) runs on ggopt_dot_rows instead of sgemm, in blocks of
# output columns of about DOT_BLOCK_ELEMENTS weight elements shared out over the threads:
# OpenBLAS's one-row sgemm streamed the weights at about half the speed, on one thread, and a
# product of one row could not be cut up. Up to 6 rows the kernel was faster than sgemm (4 kept
# for margin); from 8 sgemm is.
cdef int DOT_MAX_ROWS = 4
cdef Py_ssize_t DOT_BLOCK_ELEMENTS = 1 << 15
# A plan of dot products alone reading fewer weight elements than this runs on one thread (the
# attention products of one token, k and v of SmolLM2): waking a second costs more than it saves
# (scaled up where idle threads sleep at once, as every kernel's threshold).
cdef Py_ssize_t DOT_PARALLEL_MIN_ELEMENTS = min_parallel_work(1 << 17)
# ggopt_dot_rows holds its sums as 8-lane halves on a CPU without AVX-512 (the same bits).
cdef int NARROW = ggopt_cpu_narrow()


def set_dot_rows(int max_rows):
    """Use the dot-product kernel for products of at most ``max_rows`` rows (0: never) in
    plans built from now on (for benchmarks and tests)."""
    global DOT_MAX_ROWS
    DOT_MAX_ROWS = max_rows


def set_narrow_tiles(narrow):
    """Force the dot-product kernel's 8-lane halves (True), its 16-lane vectors (False) or this
    CPU's choice (None) (for tests: the same bits either way). Returns the setting now in use."""
    global NARROW
    NARROW = ggopt_cpu_narrow() if narrow is None else bool(narrow)
    return bool(NARROW)


def set_packing(Py_ssize_t max_elements, Py_ssize_t min_rows):
    """Change the packing rule for plans built from now on (for benchmarks and tests)."""
    global PACK_MAX_ELEMENTS, PACK_MIN_ROWS
    PACK_MAX_ELEMENTS, PACK_MIN_ROWS = max_elements, min_rows


cdef extern from "_dot_rows.h" nogil:
    void ggopt_dot_rows(const float *a, Py_ssize_t lda, const float *x, int k, float *out,
                        int rows, int narrow) noexcept


cdef extern from *:
    """
    /* acc[i, :m] += c[i, :m] for n rows (row strides lda, ldc in elements) */
    GGOPT_MULTIVERSION
    static void ggopt_add_rows(float *acc, long lda, const float *c, long ldc, int n, int m) {
        for (int i = 0; i < n; i++) {
            float *a = acc + (Py_ssize_t)i * lda;
            const float *r = c + (Py_ssize_t)i * ldc;
            for (int j = 0; j < m; j++) a[j] += r[j];
        }
    }

    /* a[i] += b[i] for i < n */
    GGOPT_MULTIVERSION
    static void ggopt_add_vec(float *a, const float *b, Py_ssize_t n) {
        for (Py_ssize_t i = 0; i < n; i++) a[i] += b[i];
    }

    /* dst[i + j*m] = src[j + i*lds] for i < m, j < k: 16 source rows at a time, so that
       both sides stream (16 reads along each row, 16 contiguous writes per column) */
    static void ggopt_transpose(float *dst, const float *src, int m, int k, int lds) {
        for (int i0 = 0; i0 < m; i0 += 16) {
            int i1 = i0 + 16 < m ? i0 + 16 : m;
            for (int j = 0; j < k; j++) {
                float *d = dst + (Py_ssize_t)j * m;
                for (int i = i0; i < i1; i++) d[i] = src[j + (Py_ssize_t)i * lds];
            }
        }
    }
    """
    void ggopt_add_rows(float *acc, long lda, const float *c, long ldc, int n,
                        int m) noexcept nogil
    void ggopt_transpose(float *dst, const float *src, int m, int k, int lds) noexcept nogil
    void ggopt_add_vec(float *a, const float *b, Py_ssize_t n) noexcept nogil


# An ILP64 Fortran sgemm (64-bit integers), e.g. the OpenBLAS NumPy's wheels ship; when set
# (use_ilp64_sgemm) every product calls it instead of SciPy's LP64 one.
ctypedef void (*sgemm64_fn)(const char *, const char *, const int64_t *, const int64_t *,
                            const int64_t *, const float *, const float *, const int64_t *,
                            const float *, const int64_t *, const float *, float *,
                            const int64_t *) noexcept nogil
cdef sgemm64_fn _sgemm64 = NULL


def use_ilp64_sgemm(size_t address) -> None:
    """Call the ILP64 ``sgemm`` at ``address`` (0: SciPy's) for every product from now on.

    The address must be a Fortran-convention ``sgemm`` with 64-bit integers (NumPy's OpenBLAS
    ``scipy_sgemm_64_``); ``backend/blas.py`` finds it and checks it on a small product.
    """
    global _sgemm64
    _sgemm64 = <sgemm64_fn>address


def cpu_favours_mkl() -> bool:
    """Whether oneMKL is taken to be the faster ``sgemm`` here: on an Intel CPU, one with
    AVX-512, or one the build cannot ask (not x86-64, or neither GCC nor clang); False on the
    others (``backend/cpu/blas.py`` tries NumPy's OpenBLAS first there)."""
    return bool(ggopt_cpu_favours_mkl())


def ilp64_sgemm_in_use() -> bool:
    """Whether products call an ILP64 sgemm (see :func:`use_ilp64_sgemm`)."""
    return _sgemm64 != NULL


cdef struct Product:
    char ta           # sgemm transa for y^T ('N' or 'T')
    char tb           # sgemm transb for x^T
    int m             # columns of out (rows of out^T)
    int n             # rows of out
    int k             # the reduction length
    int lda
    int ldb
    int ldc
    const float *a    # y
    const float *b    # x
    float *c          # out
    float *acc        # NULL, or the (n, m) rows that out is added to afterwards
    Py_ssize_t ldacc
    bint pack         # copy y^T (ta 'T') to a column-major scratch first, then call 'N'
    bint dot          # ggopt_dot_rows instead of sgemm (ta 'T', tb 'N', few rows)


cdef struct Item:
    Py_ssize_t product
    int j0            # the columns j0 .. j1-1 of out: all of them for an sgemm
    int j1


cdef struct Sum:
    float *out        # a C-contiguous block of size elements
    const float *part
    float *acc        # NULL, or a block that out is added to afterwards
    Py_ssize_t size


cdef bint _operand(Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t s0, Py_ssize_t s1,
                   char *trans, int *ld) noexcept:
    """The column-major (trans, ld) for a (rows, cols) matrix with element strides (s0, s1), or
    False when BLAS cannot read it in place (no unit stride, overlapping or huge strides)."""
    if rows <= 1 and cols <= 1:
        trans[0], ld[0] = b'N', 1
        return True
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= rows):
        trans[0] = b'N'
        ld[0] = <int>max(s1 if cols > 1 else rows, 1) if s1 <= _INT_MAX else 0
        return ld[0] > 0
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= cols):
        trans[0] = b'T'  # stored as the column-major (cols, rows) matrix
        ld[0] = <int>max(s0 if rows > 1 else cols, 1) if s0 <= _INT_MAX else 0
        return ld[0] > 0
    return False


cdef bint _unit_strides(Py_ssize_t s0, Py_ssize_t s1, Py_ssize_t *e0, Py_ssize_t *e1) noexcept:
    """Byte strides as element strides; False for negative or unaligned ones."""
    if s0 < 0 or s1 < 0 or s0 % 4 or s1 % 4:
        return False
    e0[0], e1[0] = s0 // 4, s1 // 4
    return True


cdef class GemmPlan:
    """Products ``out = x @ y`` (each optionally followed by ``acc += out``) and split-K sums,
    run by :meth:`run` on one-thread BLAS calls; the arrays are referenced, not copied."""

    cdef Product *products
    cdef Py_ssize_t n_products
    cdef Item *items  # what the threads share out: whole products, dot products' blocks
    cdef Py_ssize_t n_work
    cdef Sum *sums
    cdef Py_ssize_t n_sums
    cdef list keep  # the arrays the pointers point into
    cdef Py_ssize_t pack_elements  # the largest packed y^T: each thread's scratch
    cdef Py_ssize_t dot_elements  # the weight elements the dot products read
    cdef Py_ssize_t n_dots

    def __cinit__(self):
        self.products = NULL
        self.items = NULL
        self.n_work = 0
        self.sums = NULL
        self.n_products = 0
        self.n_sums = 0
        self.keep = []
        self.pack_elements = 0
        self.dot_elements = 0
        self.n_dots = 0

    def __dealloc__(self):
        free(self.products)
        free(self.items)
        free(self.sums)

    @property
    def n_items(self) -> int:
        """How many products the plan runs."""
        return self.n_products

    @property
    def n_packed(self) -> int:
        """How many of them copy their transposed ``y`` first (see PACK_MAX_ELEMENTS)."""
        cdef Py_ssize_t i, n = 0
        for i in range(self.n_products):
            n += self.products[i].pack
        return n

    @property
    def n_dot(self) -> int:
        """How many of them run on the dot-product kernel (see DOT_MAX_ROWS)."""
        return self.n_dots

    def add(self, const float[:, :] x not None, const float[:, :] y not None,
            float[:, :] out not None, float[:, :] acc=None) -> bool:
        """Append ``out = x @ y``, then ``acc += out`` when ``acc`` is given (the same rows,
        unit column stride, not overlapping ``out``); False, and nothing appended, when an
        operand's strides are not ones BLAS reads in place (the caller falls back)."""
        cdef Py_ssize_t r = x.shape[0], k = x.shape[1], c = y.shape[1]
        cdef Py_ssize_t xs0, xs1, ys0, ys1, os0, os1, as0 = 0, as1 = 1
        cdef Product p
        cdef char oc
        cdef Product *grown
        if y.shape[0] != k or out.shape[0] != r or out.shape[1] != c:
            raise ShapeError(f"GemmPlan.add: x ({r}, {k}) @ y ({y.shape[0]}, {c}) does not "
                             f"give out ({out.shape[0]}, {out.shape[1]})")
        if acc is not None and (acc.shape[0] != r or acc.shape[1] != c):
            raise ShapeError(f"GemmPlan.add: acc ({acc.shape[0]}, {acc.shape[1]}) is not the "
                             f"shape of out ({r}, {c})")
        if r > _INT_MAX or k > _INT_MAX or c > _INT_MAX:
            return False
        if not (_unit_strides(x.strides[0], x.strides[1], &xs0, &xs1)
                and _unit_strides(y.strides[0], y.strides[1], &ys0, &ys1)
                and _unit_strides(out.strides[0], out.strides[1], &os0, &os1)):
            return False
        if acc is not None and (not _unit_strides(acc.strides[0], acc.strides[1], &as0, &as1)
                                or (as1 != 1 and c > 1) or (as0 < c and r > 1)):
            return False
        # out^T (c, r): must be stored column-major, i.e. 'N'
        if not _operand(c, r, os1, os0, &oc, &p.ldc) or oc != b'N':
            return False
        if not _operand(c, k, ys1, ys0, &p.ta, &p.lda):  # y^T (c, k)
            return False
        if not _operand(k, r, xs1, xs0, &p.tb, &p.ldb):  # x^T (k, r)
            return False
        if r == 0 or c == 0:
            return True  # nothing to write
        p.m, p.n, p.k = <int>c, <int>r, <int>k
        p.a, p.b, p.c = &y[0, 0] if k else NULL, &x[0, 0] if k else NULL, &out[0, 0]
        p.acc, p.ldacc = NULL, 0
        p.dot = p.ta == b'T' and p.tb == b'N' and r <= DOT_MAX_ROWS and k > 0
        p.pack = (not p.dot and p.ta == b'T' and p.tb == b'N' and k * c <= PACK_MAX_ELEMENTS
                  and r >= PACK_MIN_ROWS)
        if p.pack:
            self.pack_elements = max(self.pack_elements, k * c)
        if acc is not None:
            p.acc, p.ldacc = &acc[0, 0], as0
        cdef Py_ssize_t block = c, j0, n_blocks = 1
        if p.dot:
            block = max(4, DOT_BLOCK_ELEMENTS // k // 4 * 4)
            n_blocks = (c + block - 1) // block
        grown = <Product *>realloc(self.products, (self.n_products + 1) * sizeof(Product))
        if grown == NULL:
            raise MemoryError("GemmPlan.add: out of memory")
        self.products = grown
        cdef Item *items = <Item *>realloc(self.items, (self.n_work + n_blocks) * sizeof(Item))
        if items == NULL:
            raise MemoryError("GemmPlan.add: out of memory")
        self.items = items
        for j0 in range(0, c, block):
            self.items[self.n_work] = Item(self.n_products, <int>j0, <int>min(j0 + block, c))
            self.n_work += 1
        self.products[self.n_products] = p
        self.n_products += 1
        if p.dot:
            self.dot_elements += r * k * c
            self.n_dots += 1
        self.keep += [x, y, out, acc]
        return True

    def add_sum(self, float[::1] out not None, const float[::1] part not None,
                float[::1] acc=None) -> None:
        """After the products, ``out += part`` (a split-K partial; both contiguous), then
        ``acc += out`` when ``acc`` is given (contiguous, not overlapping ``out``)."""
        if out.shape[0] != part.shape[0] or (acc is not None and acc.shape[0] != out.shape[0]):
            raise ShapeError(f"GemmPlan.add_sum: out has {out.shape[0]} elements, part "
                             f"{part.shape[0]}" + ("" if acc is None else
                                                   f", acc {acc.shape[0]}"))
        if out.shape[0] == 0:
            return
        cdef float *acc_data = NULL
        if acc is not None:
            acc_data = &acc[0]
        cdef Sum *grown = <Sum *>realloc(self.sums, (self.n_sums + 1) * sizeof(Sum))
        if grown == NULL:
            raise MemoryError("GemmPlan.add_sum: out of memory")
        self.sums = grown
        self.sums[self.n_sums] = Sum(&out[0], &part[0], acc_data, out.shape[0])
        self.n_sums += 1
        self.keep += [out, part, acc]

    def run(self, int n_threads) -> None:
        """Run every product (on up to ``n_threads`` threads), then the sums."""
        check_n_threads("GemmPlan.run", n_threads)
        cdef Py_ssize_t i
        cdef int team = <int>min(<Py_ssize_t>n_threads, self.n_work)
        if self.n_dots == self.n_products and self.dot_elements < DOT_PARALLEL_MIN_ELEMENTS:
            team = 1
        cdef float *scratch = NULL
        if self.pack_elements:
            scratch = <float *>malloc(max(team, 1) * self.pack_elements * sizeof(float))
            if scratch == NULL:
                raise MemoryError("GemmPlan.run: out of memory for packed operands")
        with nogil:
            if team > 1:
                for i in prange(self.n_work, num_threads=team, schedule="dynamic"):
                    _item(self.products, &self.items[i],
                          scratch + omp_get_thread_num() * self.pack_elements)
            else:
                for i in range(self.n_work):
                    _item(self.products, &self.items[i], scratch)
            for i in range(self.n_sums):
                ggopt_add_vec(self.sums[i].out, self.sums[i].part, self.sums[i].size)
                if self.sums[i].acc != NULL:
                    ggopt_add_vec(self.sums[i].acc, self.sums[i].out, self.sums[i].size)
        free(scratch)


cdef void _item(Product *products, Item *item, float *scratch) noexcept nogil:
    cdef Product *p = &products[item.product]
    cdef int i, j0 = item.j0, cols = item.j1 - item.j0
    if not p.dot:
        _product(p, scratch)
        return
    for i in range(p.n):
        ggopt_dot_rows(p.a + <Py_ssize_t>j0 * p.lda, p.lda, p.b + <Py_ssize_t>i * p.ldb, p.k,
                       p.c + <Py_ssize_t>i * p.ldc + j0, cols, NARROW)
    if p.acc != NULL:
        ggopt_add_rows(p.acc + j0, p.ldacc, p.c + j0, p.ldc, p.n, cols)


cdef void _product(Product *p, float *scratch) noexcept nogil:
    cdef float one = 1.0, zero = 0.0
    cdef Py_ssize_t i
    cdef int64_t m, n, k, lda, ldb, ldc
    cdef char ta = p.ta
    cdef int lda32 = p.lda
    cdef const float *a = p.a
    if p.k == 0:  # an empty sum: BLAS may not touch C with K = 0, so zero it here
        for i in range(p.n):
            memset(p.c + i * p.ldc, 0, p.m * sizeof(float))
    else:
        if p.pack:  # y^T (m, k) column-major from its transposed storage
            ggopt_transpose(scratch, p.a, p.m, p.k, p.lda)
            ta, lda32, a = b'N', p.m, scratch
        if _sgemm64 != NULL:
            m, n, k, lda, ldb, ldc = p.m, p.n, p.k, lda32, p.ldb, p.ldc
            _sgemm64(&ta, &p.tb, &m, &n, &k, &one, a, &lda, p.b, &ldb, &zero, p.c, &ldc)
        else:
            sgemm(&ta, &p.tb, &p.m, &p.n, &p.k, &one, <float *>a, &lda32, <float *>p.b,
                  &p.ldb, &zero, p.c, &p.ldc)
    if p.acc != NULL:
        ggopt_add_rows(p.acc, p.ldacc, p.c, p.ldc, p.n, p.m)


cdef void sgemm_colmajor(char ta, char tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc) noexcept nogil:
    cdef float one = 1.0, zero = 0.0
    cdef int64_t m64 = m, n64 = n, k64 = k, lda64 = lda, ldb64 = ldb, ldc64 = ldc
    if _sgemm64 != NULL:
        _sgemm64(&ta, &tb, &m64, &n64, &k64, &one, a, &lda64, b, &ldb64, &zero, c, &ldc64)
    else:
        sgemm(&ta, &tb, &m, &n, &k, &one, <float *>a, &lda, <float *>b, &ldb, &zero, c, &ldc)
