"""Model families ggopt builds graphs for: one builder (:mod:`ggopt.models.llama`) with a
part per architecture (:mod:`ggopt.models.llama.arch`: llama, qwen2, qwen3, gemma3).

``load(path)`` loads any of them, dispatching on the file's ``general.architecture``.
"""

from .llama.arch import ARCHITECTURES
from .llama.loader import Model, load

__all__ = ["ARCHITECTURES", "Model", "load"]
