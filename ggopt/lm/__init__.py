"""Language-model loops over :mod:`ggopt.models`: perplexity as ``llama-perplexity``
computes it (:mod:`.perplexity`), sampling (:mod:`.sampling`) and generation with a KV cache
(:mod:`.generation`), and fine-tuning: :class:`FineTune` in a few calls (:mod:`.session`,
docs/fine-tune-api.md); its parts: data (:mod:`.windows`, :mod:`.chat`), the loop
(:mod:`.finetune`), step controls (:mod:`.controls`), LoRA adapters (:mod:`.lora`) and the
merged GGUF (:mod:`.export`).

The fine-tune names are here too, so that a run by parts needs one import besides the model::

    from ggopt import lm
    from ggopt.models import llama

    model = llama.load("SmolLM2-135M.gguf")
    adapter = lm.lora.create(model.net, 8, alpha=16.0)   # or none: a full fine-tune
    lm.lora.attach(model.net, adapter)
    ids = lm.tokenize_texts(model.require_tokenizer(), [open("train.txt").read()])
    tuner = lm.FineTuner(model.net, lm.text_windows(ids, 256), lm.FinetuneParams(lr=1e-4))
    tuner.fit(2)
"""

from . import lora
from .chat import chat_windows, read_conversations
from .controls import StepControls, StepMonitor
from .export import ExportReport, export
from .finetune import EpochStats, FinetuneParams, FineTuner
from .generation import GenerateResult, Generator, generate
from .memory import memory_report
from .perplexity import PerplexityResult, perplexity
from .sampling import SamplingParams, sample
from .session import FineTune
from .windows import MASKED, Windows, split_point, text_windows, to_dataset, tokenize_texts

__all__ = ["GenerateResult", "Generator", "generate", "PerplexityResult", "perplexity",
           "SamplingParams", "sample", "FineTune", "FinetuneParams", "FineTuner", "EpochStats",
           "StepControls", "StepMonitor", "ExportReport", "MASKED", "Windows", "text_windows",
           "tokenize_texts", "split_point", "to_dataset", "chat_windows", "read_conversations",
           "memory_report", "lora", "export"]
