"""Chat templates (``tokenizer.chat_template``) rendered with jinja2 as Hugging Face renders
them: a sandboxed environment with ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, the
variables ``messages``, ``add_generation_prompt``, ``bos_token`` and ``eos_token``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidValueError, StateError
from ..tokenizers import Tokenizer

__all__ = ["render_chat"]


def _piece(tok: Tokenizer, tid: int | None) -> str:
    return "" if tid is None else tok.token_text(tid).decode("utf-8", errors="replace")


def render_chat(tok: Tokenizer, messages: Sequence[dict[str, str]],
                add_generation_prompt: bool = True, template: str | None = None) -> str:
    """``messages`` (``{"role": ..., "content": ...}``) through ``template`` (default: the
    tokenizer's). InvalidValueError when there is none or it fails to render."""
    source = tok.chat_template if template is None else template
    if not source:
        raise InvalidValueError("--chat: the model has no tokenizer.chat_template")
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise StateError("--chat: chat templates need jinja2 (pip install jinja2)") from None

    def raise_exception(message: str) -> Any:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        text: str = env.from_string(source).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=_piece(tok, tok.bos), eos_token=_piece(tok, tok.eos))
    except TemplateError as exc:
        raise InvalidValueError(f"--chat: the chat template failed to render: {exc}") from None
    return text
