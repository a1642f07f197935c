"""The CUDA backend over CuPy: the array backend's code on the GPU plus fused kernels
(``ops/``). Importing this package does not import CuPy; creating a backend does."""

from __future__ import annotations

from .backend import CuPyBackend

__all__ = ["CuPyBackend"]
