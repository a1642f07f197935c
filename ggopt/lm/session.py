"""A fine-tune in a few calls (:class:`FineTune`): load a llama GGUF, attach a LoRA adapter or
not, text or chat data, fit with a progress bar, validation every N steps, early stopping and
the best state kept, save the adapter and the merged GGUF, generate. The fine-tune command
(``ggopt finetune``, :mod:`ggopt.cli.finetune`) does the same with every option; the parts
are public (:mod:`.windows`, :mod:`.chat`, :mod:`.finetune`, :mod:`.controls`, :mod:`.lora`,
:mod:`.export`).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import InvalidValueError, StateError
from ..models.llama import load, weight_map
from ..opt import OptimizerParams
from ..opt.schedule import constant
from ..opt.training import FitHistory
from ..tokenizers.templates import resolve_template
from . import lora, preflight
from .chat import chat_windows, read_conversations, render
from .controls import StepControls, StepMonitor
from .export import ExportReport, export
from .finetune import EpochStats, FinetuneParams, FineTuner
from .generation import generate
from .sampling import SamplingParams
from .windows import Windows, text_windows, tokenize_texts

__all__ = ["FineTune"]

PathLike = str | os.PathLike[str]


class FineTune:
    """A model loaded from ``path`` and, with ``lora=RANK``, a new LoRA adapter attached
    (``alpha``, ``targets``, ``dropout``: PEFT's LoRA dropout while training; None: a full
    fine-tune of every weight). ``chat_template``: a jinja file or a built-in name
    (:data:`ggopt.tokenizers.templates.BUILTIN`) used instead of the file's
    ``tokenizer.chat_template`` for chat data and :meth:`generate` with ``chat=True``, and
    written into the merged GGUF (:meth:`save_merged`)."""

    def __init__(self, path: PathLike, lora_rank: int | None = None, *, alpha: float = 16.0,
                 targets: str | Sequence[str] = lora.TARGETS, seed: int = 5489,
                 dropout: float = 0.0, progress: bool = True,
                 chat_template: PathLike | None = None) -> None:
        dropout = lora.check_dropout(dropout, "FineTune")
        if dropout and lora_rank is None:
            raise InvalidValueError("FineTune: a LoRA dropout needs lora_rank (it drops out "
                                    "the adapter's input)")
        info = preflight.model_info(path, "model")
        if lora_rank is not None:
            preflight.check_lora(info, lora_rank, targets)
        self.template = None if chat_template is None else \
            resolve_template(chat_template, option="FineTune chat_template")
        self.path, self.seed, self.progress = os.fspath(path), seed, progress
        self.model = load(path, progress=progress)
        if self.template is not None:
            self.model.tokenizer = self.model.require_tokenizer().with_chat_template(
                self.template)
        self.adapter: lora.LoraAdapter | None = None
        if lora_rank is not None:
            self.adapter = lora.create(self.model.net, lora_rank, alpha, targets, seed=seed,
                                       dropout=dropout)
            lora.attach(self.model.net, self.adapter)
        self.windows: Windows | None = None
        self.val_before = self.best_loss = math.nan
        self.best_step = -1

    def data(self, text: PathLike | Sequence[PathLike] = (), chat: PathLike | None = None,
             ctx: int = 256, pack: bool = False) -> Windows:
        """Training windows of ``ctx`` tokens from UTF-8 text files (llama.cpp's windows)
        or a chat JSON-lines file (the loss on the assistant's tokens); one text file may be
        given alone. ``pack``: several conversations per chat window, each attending only to
        itself (``--chat-pack``, :func:`ggopt.lm.chat.chat_windows`)."""
        if isinstance(text, (str, os.PathLike)):
            text = [text]
        if bool(text) == (chat is not None):
            raise InvalidValueError("fine-tune data: give text files or a chat file")
        if not isinstance(pack, bool):
            raise InvalidValueError(f"fine-tune data: pack must be True or False, got {pack!r}")
        if pack and chat is None:
            raise InvalidValueError("fine-tune data: pack=True packs chat conversations; it "
                                    "needs a chat file")
        preflight.check_ctx(self.model.cfg, ctx, 1, "ctx")
        tok = self.model.require_tokenizer()
        if chat is not None:
            self.windows = chat_windows(tok, read_conversations(chat), ctx, pack=pack)
        else:
            texts = preflight.read_texts(text, "text")
            self.windows = text_windows(tokenize_texts(tok, texts), ctx)
        return self.windows

    def fit(self, epochs: int = 1, lr: float | None = None, *, batch: int = 1,
            val_split: float = 0.05, eval_every: int | None = None,
            patience: int | None = None, max_steps: int | None = None,
            log: PathLike | None = None, grad_clip: float | None = None) -> FitHistory:
        """Train (AdamW, ``lr`` default 1e-4 with LoRA, 1e-5 for a full fine-tune); a
        progress bar on stderr, the validation loss before and after each epoch (and every
        ``eval_every`` steps: then the best evaluated state is kept); ``patience``
        evaluations without improvement stop; ``log``: the JSON lines of
        :mod:`ggopt.lm.controls`; ``grad_clip``: the largest global gradient norm
        (:attr:`FinetuneParams.grad_clip`, None: no clipping). Returns the history per epoch;
        ``val_before`` holds the validation loss before training, ``best_step``/``best_loss``
        the best evaluation."""
        if self.windows is None:
            raise StateError("fine-tune fit: call data(...) first")
        rate = lr if lr is not None else (1e-4 if self.adapter is not None else 1e-5)
        fp = FinetuneParams(n_batch=batch, n_ubatch=1, lr=rate, val_split=val_split,
                            seed=self.seed, grad_clip=grad_clip)
        ft = FineTuner(self.model.net, self.windows, fp, constant(rate, OptimizerParams()))
        stream = sys.stderr if self.progress else None
        out = open(log, "w", encoding="utf-8") if log is not None else None
        try:
            monitor = StepMonitor(StepControls(max_steps, eval_every, patience, out),
                                  ft.trainable, lambda: ft.validate().loss,
                                  say=print if self.progress else None)
            ft.monitor = monitor
            before = ft.validate(stream).loss if ft.n_val_mb else math.nan
            monitor.evaluated(0, before)
            monitor.write({"step": 0, "val_loss": before})

            def report(epoch: int, train: EpochStats, val: EpochStats) -> None:
                monitor.evaluated(ft.steps_done, val.loss)
                if self.progress:
                    print(f"epoch {epoch}: train loss={train.loss:.4f} val loss={val.loss:.4f}")

            history = ft.fit(epochs, report=report, progress=stream)
            if eval_every is not None:
                monitor.restore_best()
            self.best_step, self.best_loss = monitor.best_step, monitor.best_loss
            self.val_before = before
            return history
        finally:
            ft.close()
            if out is not None:
                out.close()

    def save_adapter(self, path: PathLike) -> None:
        """The trained adapter as llama.cpp's LoRA GGUF (use it beside the unchanged base)."""
        if self.adapter is None:
            raise StateError("fine-tune save_adapter: a full fine-tune has no adapter")
        lora.save(path, self.adapter)

    def save_merged(self, path: PathLike, out_type: str = "f32") -> ExportReport:
        """The merged model (every key of the input kept); a lossy ``out_type`` that keeps
        less than half of the training warns (:class:`UserWarning`) with the number."""
        weights: Mapping[str, np.ndarray] = weight_map(self.model.net)  # one at a time
        unchanged: set[str] = set()
        if self.adapter is not None:
            unchanged = set(weights) - set(self.adapter.a)
            weights = lora.merged(weights, self.adapter)
        report = export(self.path, path, weights, out_type, unchanged,
                        chat_template=self.template)
        warning = report.loss_warning()
        if warning:
            warnings.warn(warning, UserWarning, stacklevel=2)
        return report

    def generate(self, prompt: str, n: int = 50, temp: float = 0.0, *,
                 chat: bool = False) -> str:
        """The text the model continues ``prompt`` with (greedy by default); with ``chat``,
        its answer to ``prompt`` as a user message in the chat template."""
        tok = self.model.require_tokenizer()
        if chat:
            text = render(tok, [{"role": "user", "content": prompt}], True)
            ids = tok.encode(text, add_special=False, parse_special=True)
        else:
            ids = tok.encode(prompt.encode(), add_special=True, parse_special=False)
        result = generate(self.model, ids, n, SamplingParams(temp=temp), eog=tok.eog)
        return tok.decode(result.tokens).decode("utf-8", errors="replace")
