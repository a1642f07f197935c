"""Chat templates (``tokenizer.chat_template``) rendered as Hugging Face's
``apply_chat_template`` renders them: jinja2's immutable sandbox with ``trim_blocks`` and
``lstrip_blocks``, the loop-controls extension, ``raise_exception``, ``strftime_now``, a
``tojson`` that keeps non-ASCII characters, and the variables ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token`` plus any extra ones (``tools``, ...).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ggopt.errors import InvalidValueError

__all__ = ["render_chat"]


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _check_messages(messages: object) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidValueError("messages: expected a list of {'role': ..., 'content': ...}, "
                                f"got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidValueError(f"messages[{i}]: expected a mapping with a str 'role', "
                                    f"got {m!r}")
        out.append(dict(m))
    return out


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = False, bos_token: str = "",
                eos_token: str = "", **variables: Any) -> str:
    """The text of ``messages`` (``[{"role": "user", "content": "Hi"}, ...]``) in ``template``.

    A template that does not compile or fails while rendering (``raise_exception`` included)
    raises InvalidValueError with jinja2's message.
    """
    import jinja2

    if not isinstance(template, str):
        raise InvalidValueError(f"chat template: expected a str, got {type(template).__name__}")
    checked = _check_messages(messages)
    try:
        compiled = _compile(template)
        return str(compiled.render(messages=checked, add_generation_prompt=add_generation_prompt,
                                   bos_token=bos_token, eos_token=eos_token, **variables))
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidValueError(f"chat template does not compile: {exc.message} "
                                f"(line {exc.lineno})") from None
    except jinja2.TemplateError as exc:
        raise InvalidValueError(f"chat template failed to render: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise InvalidValueError(f"chat template failed to render: {type(exc).__name__}: "
                                f"{exc}") from None
