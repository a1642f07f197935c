"""Language-model loops over :mod:`ggopt.models`: perplexity as ``llama-perplexity``
computes it (:mod:`.perplexity`), sampling (:mod:`.sampling`) and generation with a KV cache
(:mod:`.generation`), and fine-tuning: data (:mod:`.windows`, :mod:`.chat`), the loop
(:mod:`.finetune`), LoRA adapters (:mod:`.lora`) and the merged GGUF (:mod:`.export`)."""

from .generation import GenerateResult, Generator, generate
from .perplexity import PerplexityResult, perplexity
from .sampling import SamplingParams, sample

__all__ = ["GenerateResult", "Generator", "generate", "PerplexityResult", "perplexity",
           "SamplingParams", "sample"]
