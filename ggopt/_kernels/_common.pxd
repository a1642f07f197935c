# Helpers shared by the kernels: the scalar float32 math of scalar_math.h (written so that loops
# over it vectorize: no libm call, no branch), the GGOPT_MULTIVERSION marker for hot C loops, a
# strided 4-D array descriptor, and a driver that splits the elements of a 4-D shape between
# OpenMP threads.

from cython.parallel cimport prange


cdef extern from *:
    """
    #include <math.h>
    #include <stdint.h>
    #include <stdlib.h>
    #if defined(__unix__) || defined(__APPLE__)
    #include <unistd.h>
    #endif

    /* The most threads a kernel accepts: ggopt.backend.cpu.threads.MAX_N_THREADS, i.e. four
       per online CPU and at least 512 (OpenMP runtimes end the process on far larger teams). */
    static long ggopt_max_n_threads(void) {
        long n = 1;
    #if defined(_SC_NPROCESSORS_ONLN)
        n = sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1) n = 1;
    #endif
        return 4 * n > 512 ? 4 * n : 512;
    }

    /* 1 when the CPU has no AVX-512: 16 vector registers, where a 16-float vector takes two
       (the kernels' narrow register tiles, GCC splitting such vectors badly; the same bits
       either way) */
    #if defined(__GNUC__)
    __attribute__((unused))
    #endif
    static int ggopt_cpu_narrow(void) {
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
        __builtin_cpu_init();
        return !__builtin_cpu_supports("avx512f");
    #else
        return 0;
    #endif
    }

    /* 1 where oneMKL is taken to be the faster sgemm: an Intel CPU, or one with AVX-512 (and
       wherever the CPU cannot be asked); 0 on the others (backend/cpu/blas.py) */
    #if defined(__GNUC__)
    __attribute__((unused))
    #endif
    static int ggopt_cpu_favours_mkl(void) {
    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
        __builtin_cpu_init();
        return __builtin_cpu_is("intel") || __builtin_cpu_supports("avx512f");
    #else
        return 1;
    #endif
    }

    /* the scalar math shared with the CUDA kernels: ggopt_expf, ggopt_sigmoidf, the unary
       functions and their derivatives, the optimizer updates */
    #include "scalar_math.h"

    /* Mark the loops that are worth more copies of their machine code, for AVX-512
       (x86-64-v4) and AVX2 (x86-64-v3): GCC builds all three and picks one when the module
       loads (an ifunc, so glibc on x86-64 only). Only the speed differs: setup.py compiles
       with -ffp-contract=off, so no FMA changes a rounding (tests/kernels/test_no_fma.py), and
       vectorized loops keep the order of every floating-point reduction of the source.
       Helpers called from such loops are GGOPT_ROW_INLINE: always inlined, so that they take
       the instruction set of their caller. */
    #if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && \
        defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    #define GGOPT_MULTIVERSION \
        __attribute__((unused, target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
    #elif defined(__GNUC__)
    #define GGOPT_MULTIVERSION __attribute__((unused))
    #else
    #define GGOPT_MULTIVERSION
    #endif
    #if defined(__GNUC__)
    #define GGOPT_ROW_INLINE static inline __attribute__((always_inline))
    #else
    #define GGOPT_ROW_INLINE static inline
    #endif
    """
    float ggopt_expf(float x) noexcept nogil
    float ggopt_sigmoidf(float x) noexcept nogil
    long ggopt_max_n_threads() noexcept nogil
    int ggopt_cpu_narrow() noexcept nogil
    int ggopt_cpu_favours_mkl() noexcept nogil


cdef inline int check_n_threads(str fn, int n_threads) except -1:
    """Refuse a thread count outside ``[1, MAX_N_THREADS]`` with InvalidValueError."""
    if n_threads < 1 or n_threads > 512:
        if n_threads < 1 or n_threads > ggopt_max_n_threads():
            from ggopt.errors import InvalidValueError
            raise InvalidValueError(
                f"{fn}: n_threads must be in [1, {ggopt_max_n_threads()}], got {n_threads}")
    return 0


cdef inline int check_shape(str fn, str name, const Py_ssize_t *shape, int ndim,
                            Py_ssize_t e0, Py_ssize_t e1=0, Py_ssize_t e2=0,
                            Py_ssize_t e3=0) except -1:
    """Raise ShapeError unless ``shape[:ndim]`` equals ``(e0, e1, e2, e3)[:ndim]``."""
    cdef Py_ssize_t e[4]
    cdef int k
    e[0] = e0
    e[1] = e1
    e[2] = e2
    e[3] = e3
    for k in range(ndim):
        if shape[k] != e[k]:
            from ggopt.errors import ShapeError
            raise ShapeError(f"{fn}: {name} has shape {tuple([shape[i] for i in range(ndim)])}"
                             f", expected {tuple([e[i] for i in range(ndim)])}")
    return 0


cdef inline int check_positive(str fn, str name, long value) except -1:
    """Raise InvalidValueError unless ``value >= 1``."""
    if value < 1:
        from ggopt.errors import InvalidValueError
        raise InvalidValueError(f"{fn}: {name} must be >= 1, got {value}")
    return 0


cdef inline int check_non_negative(str fn, str name, long value) except -1:
    """Raise InvalidValueError unless ``value >= 0``."""
    if value < 0:
        from ggopt.errors import InvalidValueError
        raise InvalidValueError(f"{fn}: {name} must be >= 0, got {value}")
    return 0


cdef inline int check_strides_pads_dilations(str fn, int s0, int s1, int p0, int p1, int d0,
                                             int d1) except -1:
    """A window's strides and dilations >= 1 and paddings >= 0 (InvalidValueError)."""
    check_positive(fn, "s0", s0)
    check_positive(fn, "s1", s1)
    check_non_negative(fn, "p0", p0)
    check_non_negative(fn, "p1", p1)
    check_positive(fn, "d0", d0)
    check_positive(fn, "d1", d1)
    return 0


cdef struct Arr4:
    char *data
    Py_ssize_t n[4]   # shape, NumPy order (ne3, ne2, ne1, ne0)
    Py_ssize_t s[4]   # byte strides


cdef inline void arr4_set(Arr4 *a, const float[:, :, :, :] m) noexcept:
    cdef int k
    a.data = <char *>&m[0, 0, 0, 0]
    for k in range(4):
        a.n[k] = m.shape[k]
        a.s[k] = m.strides[k]


cdef inline Py_ssize_t arr4_size(const Arr4 *a) noexcept nogil:
    return a.n[0] * a.n[1] * a.n[2] * a.n[3]


cdef inline bint arr4_c_contig(const Arr4 *a) noexcept nogil:
    """True when the float32 array is C-contiguous (strides of length-1 dims do not matter)."""
    cdef Py_ssize_t expect = 4
    cdef int k
    for k in range(3, -1, -1):
        if a.n[k] != 1 and a.s[k] != expect:
            return False
        expect *= a.n[k]
    return True


cdef inline void arr4_flatten(Arr4 *a) noexcept nogil:
    """View a C-contiguous array as a single row."""
    a.n[3] = arr4_size(a)
    a.n[0] = 1
    a.n[1] = 1
    a.n[2] = 1
    a.s[3] = 4


cdef inline bint arr4_same_shape(const Arr4 *a, const Arr4 *b) noexcept nogil:
    return (a.n[0] == b.n[0] and a.n[1] == b.n[1] and a.n[2] == b.n[2]
            and a.n[3] == b.n[3])


cdef inline str arr4_shape_str(const Arr4 *a):
    return f"({a.n[0]}, {a.n[1]}, {a.n[2]}, {a.n[3]})"


cdef inline Py_ssize_t tile_index(Py_ssize_t i, Py_ssize_t nb, Py_ssize_t n) noexcept nogil:
    """Index into a dim of length nb that tiles a dim of length n (ggml's repeat rule)."""
    if nb == n:
        return i
    if nb == 1:
        return 0
    return i % nb


# A row-piece function: handles columns [c0, c1) of the row (i3, i2, i1) and may add to *acc.
ctypedef void (*row_piece_fn)(void *ctx, Py_ssize_t i3, Py_ssize_t i2, Py_ssize_t i1,
                              Py_ssize_t c0, Py_ssize_t c1, double *acc) noexcept nogil


cdef inline void walk_elements(const Py_ssize_t *shape, row_piece_fn f, void *ctx,
                               Py_ssize_t e0, Py_ssize_t e1, double *acc) noexcept nogil:
    """Call f on every row piece of the flattened element range [e0, e1) of ``shape``."""
    cdef Py_ssize_t n0 = shape[3], n1 = shape[2], n2 = shape[1]
    cdef Py_ssize_t row = e0 // n0
    cdef Py_ssize_t c = e0 - row * n0, cend
    cdef Py_ssize_t i1 = row % n1, i2 = (row // n1) % n2, i3 = row // (n1 * n2)
    while e0 < e1:
        cend = min(n0, c + (e1 - e0))
        f(ctx, i3, i2, i1, c, cend, acc)
        e0 += cend - c
        c = 0
        i1 += 1
        if i1 == n1:
            i1 = 0
            i2 += 1
            if i2 == n2:
                i2 = 0
                i3 += 1


cdef inline double drive_elements(const Py_ssize_t *shape, row_piece_fn f, void *ctx,
                                  bint par, int n_threads) noexcept nogil:
    """Split the elements of ``shape`` into one equal range per thread and walk them in
    parallel; returns the sum of what f added to acc.

    Without par (too little work) the range is walked right here: an OpenMP region, even one
    whose if-clause is false (prange's use_threads_if), costs about a microsecond in libgomp.
    """
    cdef Py_ssize_t total = shape[0] * shape[1] * shape[2] * shape[3]
    cdef Py_ssize_t nr = n_threads
    cdef Py_ssize_t k
    cdef double acc = 0
    cdef double part
    if total == 0:
        return 0
    if not par or n_threads < 2:
        walk_elements(shape, f, ctx, 0, total, &acc)
        return acc
    for k in prange(nr, num_threads=n_threads, schedule="static"):
        part = 0
        walk_elements(shape, f, ctx, total * k // nr, total * (k + 1) // nr, &part)
        acc += part
    return acc
