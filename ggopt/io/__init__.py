"""File formats: ``idx`` (MNIST's IDX, raw or gzip) and ``gguf`` (ggml's model files).

The submodules load on first use, so ``import ggopt.io`` does not import the ``gguf`` package.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["idx", "gguf"]


def __getattr__(name: str) -> ModuleType:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
