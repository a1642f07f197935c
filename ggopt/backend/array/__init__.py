"""The array backend: graph nodes as NumPy (or CuPy) array code. Over NumPy it is the reference
every kernel is tested against, and it is never optimized: clarity is its job."""

from __future__ import annotations

from .backend import ArrayBackend, numpy_backend

__all__ = ["ArrayBackend", "numpy_backend"]
