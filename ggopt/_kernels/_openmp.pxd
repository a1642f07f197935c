# The only place ggopt touches omp.h. Every OpenMP routine a kernel needs is cimported from
# here, so a build without OpenMP (no -fopenmp, _OPENMP undefined) still compiles: the
# fallbacks below describe a single thread. Cython's prange already wraps its pragmas in
# #ifdef _OPENMP, so kernels built without OpenMP simply run serially.

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define GGOPT_OPENMP_ENABLED 1
    #else
    #define GGOPT_OPENMP_ENABLED 0
    #define omp_get_max_threads() 1
    #define omp_get_thread_num() 0
    #define omp_get_num_threads() 1
    #endif
    """
    bint GGOPT_OPENMP_ENABLED
    int omp_get_max_threads() noexcept nogil
    int omp_get_thread_num() noexcept nogil
    int omp_get_num_threads() noexcept nogil
