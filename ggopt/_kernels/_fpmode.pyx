"""Flush-to-zero for the threads of a compute (x86: the MXCSR bits FTZ and DAZ).

With both bits set, a subnormal float32 operand reads as zero and a subnormal result is written
as zero. The control word is per thread, so :func:`begin` sets the bits on the calling thread
and, from one OpenMP region, on the team threads that the kernels' regions of up to
``n_threads`` threads reuse (libgomp keeps a pool per calling thread); :func:`end` clears them
there and restores the caller's word. Elsewhere than on x86 both are no-ops
(:func:`supported` is False).
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


def supported():
    """True where the CPU has flush-to-zero and denormals-are-zero bits that this module sets."""
    return FLUSH_BITS != 0


def flushing():
    """True when the calling thread flushes subnormals (both bits set)."""
    return FLUSH_BITS != 0 and (fp_get() & FLUSH_BITS) == FLUSH_BITS


def begin(int n_threads):
    """Set both bits on this thread and on the team threads of regions of up to ``n_threads``;
    return this thread's previous control word, for :func:`end`."""
    cdef unsigned int saved = fp_get()
    if FLUSH_BITS == 0:
        return saved
    fp_set(saved | FLUSH_BITS)
    if n_threads > 1:
        with nogil, parallel(num_threads=n_threads):
            fp_set(fp_get() | FLUSH_BITS)
    return saved


def end(int n_threads, unsigned int saved):
    """Clear both bits on the team threads and give this thread back its word ``saved``."""
    if FLUSH_BITS == 0:
        return
    if n_threads > 1:
        with nogil, parallel(num_threads=n_threads):
            fp_set(fp_get() & ~FLUSH_BITS)
    fp_set(saved)


def set_this_thread(bint on):
    """Set (``on``) or clear both bits on the calling thread only; return its previous word."""
    cdef unsigned int saved = fp_get()
    fp_set((saved | FLUSH_BITS) if on else (saved & ~FLUSH_BITS))
    return saved


def restore_this_thread(unsigned int saved):
    """Give the calling thread back the word :func:`set_this_thread` returned."""
    fp_set(saved)
