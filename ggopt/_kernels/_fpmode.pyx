"""Flush-to-zero for the threads of a compute (x86: the MXCSR bits FTZ and DAZ).

With both bits set, a subnormal float32 operand reads as zero and a subnormal result is written
as zero. The control word is per thread, so :class:`ComputeFloatMode` sets the bits on the
calling thread and, from one OpenMP region, on the team threads that the kernels' regions of up to
``n_threads`` threads reuse (libgomp keeps a pool per calling thread); on leaving it clears
them there and restores the caller's word. Elsewhere than on x86 it changes nothing
(:func:`supported` is False).

:class:`ComputeFloatMode` is the scope of one compute. Its ``__enter__`` and ``__exit__`` are
C code: a KeyboardInterrupt (or any signal handler's exception) is raised only between two
Python bytecodes, so it cannot land after the bits are set and before the scope has recorded
the caller's word, nor inside the restore. Once ``__enter__`` returns, the ``with`` statement
calls ``__exit__`` whatever the body raises.
"""

from cython.parallel cimport parallel

cdef extern from *:
    """
    #if defined(__x86_64__) || defined(_M_X64) || (defined(__i386__) && defined(__SSE2__))
    #include <xmmintrin.h>
    #define GGOPT_FP_FLUSH_BITS 0x8040u /* FTZ (bit 15) | DAZ (bit 6) */
    static inline unsigned int ggopt_fp_get(void) { return _mm_getcsr(); }
    static inline void ggopt_fp_set(unsigned int word) { _mm_setcsr(word); }
    #else
    #define GGOPT_FP_FLUSH_BITS 0u
    static inline unsigned int ggopt_fp_get(void) { return 0u; }
    static inline void ggopt_fp_set(unsigned int word) { (void)word; }
    #endif
    """
    const unsigned int FLUSH_BITS "GGOPT_FP_FLUSH_BITS"
    unsigned int fp_get "ggopt_fp_get"() noexcept nogil
    void fp_set "ggopt_fp_set"(unsigned int word) noexcept nogil


cdef bint _enabled = True  # ggopt.set_flush_denormals


def set_enabled(bint on):
    """Whether :class:`ComputeFloatMode` scopes entered from now on flush (the caller,
    ``ggopt.backend.cpu.denormals``, checks the argument)."""
    global _enabled
    _enabled = on


def enabled():
    """The choice :func:`set_enabled` made (True by default)."""
    return _enabled


def supported():
    """True where the CPU has flush-to-zero and denormals-are-zero bits that this module sets."""
    return FLUSH_BITS != 0


def flushing():
    """True when the calling thread flushes subnormals (both bits set)."""
    return FLUSH_BITS != 0 and (fp_get() & FLUSH_BITS) == FLUSH_BITS


cdef unsigned int _begin(int n_threads) noexcept nogil:
    cdef unsigned int saved = fp_get()
    if FLUSH_BITS == 0:
        return saved
    fp_set(saved | FLUSH_BITS)
    if n_threads > 1:
        with parallel(num_threads=n_threads):
            fp_set(fp_get() | FLUSH_BITS)
    return saved


cdef void _end(int n_threads, unsigned int saved) noexcept nogil:
    if FLUSH_BITS == 0:
        return
    if n_threads > 1:
        with parallel(num_threads=n_threads):
            fp_set(fp_get() & ~FLUSH_BITS)
    fp_set(saved)


cdef class ComputeFloatMode:
    """The float mode of one compute: flush-to-zero on the calling thread and on the OpenMP
    team threads of up to ``n_threads`` while inside (when :func:`enabled` and
    :func:`supported`), the caller's previous state afterwards, also when the body raises or
    is interrupted.

    ``outer``, a context manager or None, is entered before the mode is set and left after
    it is restored (the CPU backend's BLAS thread limit): the mode is the innermost part, set
    and restored with no Python code in between.
    """

    cdef int _n_threads
    cdef bint _active
    cdef unsigned int _saved
    cdef object _outer

    def __cinit__(self, int n_threads, outer=None):
        self._n_threads = n_threads
        self._active = False
        self._saved = 0
        self._outer = outer

    def __enter__(self):
        if self._outer is not None:
            self._outer.__enter__()
        # From here to the return no Python bytecode runs, so no signal handler either.
        if _enabled and FLUSH_BITS != 0 and not self._active:
            with nogil:
                self._saved = _begin(self._n_threads)
            self._active = True
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._active:
            self._active = False
            with nogil:
                _end(self._n_threads, self._saved)
        if self._outer is not None:
            self._outer.__exit__(exc_type, exc, tb)
        return False


def set_this_thread(bint on):
    """Set (``on``) or clear both bits on the calling thread only; return its previous word."""
    cdef unsigned int saved = fp_get()
    fp_set((saved | FLUSH_BITS) if on else (saved & ~FLUSH_BITS))
    return saved


def restore_this_thread(unsigned int saved):
    """Give the calling thread back the word :func:`set_this_thread` returned."""
    fp_set(saved)
