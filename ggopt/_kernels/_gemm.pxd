# What other kernel modules cimport from _gemm: one column-major BLAS sgemm call (SciPy's, or
# the ILP64 one that use_ilp64_sgemm installed), C = A @ B with alpha 1, beta 0.

cdef void sgemm_colmajor(char ta, char tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc) noexcept nogil
