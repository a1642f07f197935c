"""Language-model loops over :mod:`ggopt.models`: perplexity as ``llama-perplexity``
computes it (:mod:`.perplexity`), sampling (:mod:`.sampling`) and generation with a KV cache
(:mod:`.generation`), and fine-tuning: :class:`FineTune` in a few calls (:mod:`.session`,
docs/fine-tune-api.md); its parts: data (:mod:`.windows`, :mod:`.chat`), the loop
(:mod:`.finetune`), step controls (:mod:`.controls`), LoRA adapters (:mod:`.lora`) and the
merged GGUF (:mod:`.export`)."""

from .controls import StepControls, StepMonitor
from .export import ExportReport, export
from .finetune import EpochStats, FinetuneParams, FineTuner
from .generation import GenerateResult, Generator, generate
from .perplexity import PerplexityResult, perplexity
from .sampling import SamplingParams, sample
from .session import FineTune

__all__ = ["GenerateResult", "Generator", "generate", "PerplexityResult", "perplexity",
           "SamplingParams", "sample", "FineTune", "FineTuner", "FinetuneParams", "EpochStats",
           "StepControls", "StepMonitor", "ExportReport", "export"]
