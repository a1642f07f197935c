"""Examples built on ggopt's public API.

- :mod:`ggopt.examples.mnist`: ggml's MNIST example (``python -m ggopt.examples.mnist``),
  fully connected and convolutional models trained with :func:`ggopt.opt.fit`, GGUF in and out.
"""
