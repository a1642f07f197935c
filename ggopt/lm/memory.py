"""Where a fine-tune's memory goes: the model's weights (the frozen base with LoRA, quantized
or F32, mapped from the file or owned), the trainable parameters, the optimizer state
(gradient accumulators and AdamW moments), the activations (the scheduler's compute buffers)
and the batch inputs, beside the process's peak resident set size."""

from __future__ import annotations

import dataclasses
import resource
import sys

from ..models.llama.mapped import base_bytes
from .finetune import FineTuner

__all__ = ["MemoryReport", "memory_report", "peak_rss_bytes"]


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (``getrusage``'s ``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes per use. ``weights_*`` are the model's weights (the frozen base under LoRA, the
    trained weights themselves in a full fine-tune, then also counted in ``param_bytes``)."""

    weights_bytes: int
    weights_f32_bytes: int  # the same weights in F32
    weights_mapped_bytes: int  # of weights_bytes: the file's read-only map (page cache)
    weight_types: dict[str, int]  # type name -> tensor count
    param_bytes: int  # trainable parameters (PARAM tensors)
    n_params: int
    optimizer_bytes: int  # AdamW moments + gradient accumulators (if any, see lines())
    activation_bytes: int  # compute buffers
    input_bytes: int  # tokens, label ids, the loss weight
    peak_rss_bytes: int
    weights_trained: bool

    def lines(self) -> list[str]:
        """The report as printed by the fine-tune command (which prints the peak RSS once,
        at its end, the export included)."""
        mb = 1e6
        types = ", ".join(f"{n} {k}" for k, n in sorted(self.weight_types.items()))
        role = "weights (trained)" if self.weights_trained else "base weights (frozen)"
        ratio = self.weights_bytes / self.weights_f32_bytes if self.weights_f32_bytes else 0.0
        return [
            f"memory: {role} {self.weights_bytes / mb:.1f} MB ({types}; {ratio:.2f}x of F32's "
            f"{self.weights_f32_bytes / mb:.1f} MB; {self.weights_mapped_bytes / mb:.1f} MB "
            f"mapped from the file)",
            f"memory: trainable parameters {self.param_bytes / mb:.1f} MB "
            f"({self.n_params} values), optimizer state {self.optimizer_bytes / mb:.1f} MB "
            f"(AdamW moments, and gradient accumulators where a step has several "
            f"micro-batches or the graphs are dynamic)",
            f"memory: activations {self.activation_bytes / mb:.1f} MB (compute buffers, "
            f"gradients of a one-micro-batch static step included), "
            f"inputs {self.input_bytes / mb:.1f} MB (tokens, label ids, loss weight)",
        ]


def memory_report(ft: FineTuner) -> MemoryReport:
    """The memory of ``ft`` after at least one training step (before it, the optimizer state
    and the compute buffers do not exist yet and count 0)."""
    net = ft.net
    held, as_f32, mapped = base_bytes(net)
    types: dict[str, int] = {}
    for t in net.params.values():
        types[t.type.name] = types.get(t.type.name, 0) + 1
    state = ft.opt_ctx.state()
    params = list(state.params)
    opt = sum(acc.nbytes() for acc in state.param_accs.values())
    opt += sum(m.nbytes() + v.nbytes() for m, v in state.moments.values())
    ctxs = [ft.inp.ctx, ft.loss_in.ctx] + ([] if ft.dropout is None else [ft.dropout.ctx])
    inputs = sum(t.nbytes() for c in ctxs for t in c)
    weight_ids = {id(t) for t in net.params.values()}
    return MemoryReport(
        weights_bytes=held, weights_f32_bytes=as_f32, weights_mapped_bytes=mapped,
        weight_types=types, param_bytes=sum(p.nbytes() for p in params),
        n_params=sum(p.nelements() for p in params), optimizer_bytes=opt,
        activation_bytes=net.sched.held_buffer_bytes(), input_bytes=inputs,
        peak_rss_bytes=peak_rss_bytes(),
        weights_trained=any(id(p) in weight_ids for p in params))
