"""Compiled CPU kernels (Cython + OpenMP).

Arrays come in NumPy order: a ggml tensor with ``ne = [ne0, ne1, ne2, ne3]`` is a 4-D array of
shape ``(ne3, ne2, ne1, ne0)`` with any byte strides. Kernels never allocate their outputs
(``dst`` may be the same memory as an input) and take ``n_threads`` as their last argument.
"""
