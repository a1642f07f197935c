"""Compiled CPU kernels (Cython + OpenMP).

Arrays come in NumPy order: a ggml tensor with ``ne = [ne0, ne1, ne2, ne3]`` is a 4-D array of
shape ``(ne3, ne2, ne1, ne0)`` with any byte strides. Kernels never allocate their outputs and
take ``n_threads`` as their last argument. The element-wise, reduction, softmax and optimizer
kernels accept ``dst`` being exactly the memory of an input (the allocator's in-place reuse);
the convolution, pooling, row-gathering and copy kernels need a ``dst`` that overlaps no input.
``_pretok`` and ``_merge`` are the tokenizers' scanning and merge loops (``ggopt.tokenizers``):
single-threaded, on Python strings, returning lists.
"""
