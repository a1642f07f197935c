"""Chat templates given by the user instead of the file's ``tokenizer.chat_template``: a
built-in name (:data:`BUILTIN`) or a jinja file, read and compiled under the same budget as a
template from a GGUF file (:class:`~ggopt.tokenizers.chat.TemplateLimits`, the sandboxed
worker of :mod:`.chat`).

A model whose file carries no template (Gemma 3 270M as packaged) is given one for chat SFT
and ``generate --chat``; the fine-tune writes it into the merged GGUF's
``tokenizer.chat_template``, so the result renders its own turns.
"""

from __future__ import annotations

import os

from ggopt.errors import InvalidValueError
from ggopt.tokenizers.chat import DEFAULT_LIMITS, TemplateLimits, render_chat

__all__ = ["BUILTIN", "GEMMA3", "MAX_TEMPLATE_BYTES", "resolve_template"]

#: Gemma 3's chat template as Google ships it with the instruction-tuned models
#: (``tokenizer_config.json`` of google/gemma-3-*-it): a system message becomes the first user
#: turn's prefix, the assistant is ``model``, every content trimmed, turns
#: ``<start_of_turn>ROLE\n...<end_of_turn>\n``, the generation prompt ``<start_of_turn>model\n``.
GEMMA3 = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n")

#: The templates known by name (``--chat-template gemma3``); llama.cpp calls the format
#: ``gemma``.
BUILTIN = {"gemma3": GEMMA3, "gemma": GEMMA3}

#: The largest template file read (a template is code, not data).
MAX_TEMPLATE_BYTES = 1 << 20

_PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def resolve_template(spec: str | os.PathLike[str], *, bos_token: str = "",
                     eos_token: str = "", limits: TemplateLimits = DEFAULT_LIMITS,
                     option: str = "--chat-template") -> str:
    """The template text of ``spec``: a name of :data:`BUILTIN`, else the path of a UTF-8
    jinja file of at most :data:`MAX_TEMPLATE_BYTES`; either is compiled and rendered once
    (a user turn and an assistant turn) in the sandboxed worker under ``limits``, so a bad
    template stops here, before any model loads.

    Raises
    ------
    InvalidValueError
        Not a built-in name and not a readable file, a file too large or not UTF-8, a
        template that does not compile or fails on a two-turn conversation (the message
        names ``option`` and the file).
    """
    if isinstance(spec, str) and spec in BUILTIN:
        text, source = BUILTIN[spec], f"{option} {spec}"
    else:
        if not isinstance(spec, (str, os.PathLike)) or not os.fspath(spec):
            raise InvalidValueError(f"{option}: expected a template file or one of "
                                    f"{', '.join(BUILTIN)}, got {spec!r}")
        path = os.fspath(spec)
        source = f"{option} {path!r}"
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_TEMPLATE_BYTES + 1)
        except OSError as exc:
            raise InvalidValueError(f"{source}: not a built-in template "
                                    f"({', '.join(BUILTIN)}) and not a readable file: "
                                    f"{exc.strerror or exc}") from None
        if len(data) > MAX_TEMPLATE_BYTES:
            raise InvalidValueError(f"{source}: larger than {MAX_TEMPLATE_BYTES} bytes "
                                    f"(a chat template is a jinja program, not data)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidValueError(f"{source}: not UTF-8 ({exc})") from None
        if not text.strip():
            raise InvalidValueError(f"{source}: the file is empty")
    render_chat(text, _PROBE, add_generation_prompt=False, bos_token=bos_token,
                eos_token=eos_token, limits=limits, source=source)
    return text
