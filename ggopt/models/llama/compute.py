"""The compute type of a llama's weight products: ``"f32"`` (default, every product in F32) or
``"bf16"`` (the weights' products in BF16, F32 sums), and what each choice rounds where.

With ``"bf16"`` a product with a weight runs as ggml's ``mul_mat`` of a BF16 weight: the
activations are rounded to BF16 (round to nearest even), the sums are F32; its gradient with
respect to the activations (``dx = W^T dy``) rounds ``dy`` to BF16 likewise. Two ways to get a
BF16 weight:

- **stored** (inference, LoRA: the base is frozen): ``load(path, compute_type="bf16")``
  converts every matrix once, at load, with ggml's F32 -> BF16 rounding (half the memory);
  nothing of the base is a PARAM.
- **rounded per graph** (a full fine-tune: the weights and AdamW's state stay F32, the master
  copy): the graph starts with one ``cpy`` F32 -> BF16 node per weight matrix (autocast's
  recipe without its per-call casts; each micro-batch's graph rounds once) and the products use
  the copies; the weights' gradients are BF16 products too (``out_prod(cpy(x -> BF16), dy)``,
  F32 sums, as autocast) and reach the F32 master through the ``cpy``'s backward.

Either way the norms, rope, attention (its per-head products and softmax), SwiGLU, the residual
adds, LoRA's adapters, the embedding lookup of an F32 master and the loss stay F32.
"""

from __future__ import annotations

from ...errors import InvalidValueError

__all__ = ["COMPUTE_TYPES", "check_compute_type", "HELP", "load_compute_type"]

#: The compute types a model, a fine-tune and the command lines take.
COMPUTE_TYPES = ("f32", "bf16")

#: The command lines' ``--compute-type`` help: what is rounded where.
HELP = ("f32 (default): every product in F32. bf16: the weights' products (the seven "
        "projections of each block and the output head / tied embedding, forward and the "
        "gradient to their input) run with BF16 operands and F32 sums: the activations (and "
        "the incoming gradients) rounded to BF16 as ggml's mul_mat of a BF16 weight does. "
        "LoRA and inference store the frozen base in BF16 (converted once at load, half the "
        "memory); a full fine-tune keeps F32 weights and AdamW state, rounds the weights to "
        "BF16 once per step's graph and computes their gradients as BF16 products too. "
        "Norms, attention, softmax, adapters and the loss stay F32. A kept (--base-type "
        "keep) quantized, F16 or BF16 matrix computes in its own type")


def check_compute_type(value: object, where: str) -> str:
    """``value`` if it is one of :data:`COMPUTE_TYPES`, else InvalidValueError."""
    if not isinstance(value, str) or value not in COMPUTE_TYPES:
        raise InvalidValueError(f"{where}: compute_type must be one of "
                                f"{', '.join(COMPUTE_TYPES)}, got {value!r}")
    return value


def load_compute_type(compute_type: str, trains_base: bool) -> str:
    """The ``compute_type`` to load a model with for a run of ``compute_type``: the run's own
    for inference and LoRA (a BF16 base stored at load), ``"f32"`` when the run trains the base
    weights (a full fine-tune: F32 masters, rounded per graph by the fine-tune)."""
    check_compute_type(compute_type, "load_compute_type")
    return "f32" if trains_base else compute_type
