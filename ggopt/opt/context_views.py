"""The read-only properties of an :class:`~ggopt.opt.OptContext`: its graph tensors (inputs,
outputs, labels, loss, predictions; ggml: ``ggml_opt_inputs`` ... ``ggml_opt_ncorrect``) and
what it was built for (ggml: ``ggml_opt_static_graphs``, ``..._optimizer_type``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tensor import Tensor
from .enums import BuildType, LossType, OptimizerType

if TYPE_CHECKING:
    from .build import Spec, _Build

__all__ = ["ContextViews"]


class ContextViews:
    """The read-only properties of :class:`~ggopt.opt.OptContext` (a mixin: the context
    sets ``_spec``, ``_inputs``, ``_outputs`` and ``_b``, the last build)."""

    _spec: Spec
    _inputs: Tensor | None
    _outputs: Tensor | None
    _b: _Build | None

    @property
    def inputs(self) -> Tensor | None:
        """Input tensor (ggml: ``ggml_opt_inputs``); dynamic graphs: valid until next alloc."""
        return self._inputs

    @property
    def outputs(self) -> Tensor | None:
        """Output tensor (ggml: ``ggml_opt_outputs``)."""
        return self._outputs

    @property
    def labels(self) -> Tensor | None:
        """Labels input; None for MEAN and SUM losses (ggml: ``ggml_opt_labels``)."""
        return self._b.labels if self._b is not None else None

    @property
    def loss(self) -> Tensor | None:
        """Scalar loss tensor (ggml: ``ggml_opt_loss``)."""
        return self._b.loss if self._b is not None else None

    @property
    def pred(self) -> Tensor | None:
        """Predicted classes, CROSS_ENTROPY only (ggml: ``ggml_opt_pred``)."""
        return self._b.pred if self._b is not None else None

    @property
    def ncorrect(self) -> Tensor | None:
        """Number of correct predictions, CROSS_ENTROPY only (ggml: ``ggml_opt_ncorrect``)."""
        return self._b.ncorrect if self._b is not None else None

    @property
    def static_graphs(self) -> bool:
        """True when the graphs were built once at construction (``ggml_opt_static_graphs``)."""
        return self._spec.static_graphs

    @property
    def optimizer_type(self) -> OptimizerType:
        """The optimizer (ggml: ``ggml_opt_context_optimizer_type``)."""
        return self._spec.optimizer

    @property
    def loss_type(self) -> LossType:
        return self._spec.loss_type

    @property
    def build_type(self) -> BuildType:
        """Largest graph this context builds."""
        return self._spec.build_type

    @property
    def opt_period(self) -> int:
        """Physical batches per optimizer step (over all ranks when data-parallel)."""
        return self._spec.opt_period
