"""The chat-template worker: a child process (``python -I chat_worker.py``) that compiles and
renders jinja2 templates under a memory limit (``RLIMIT_AS``) while its parent
(:mod:`ggopt.tokenizers.chat`) holds the wall-time limit and kills it on expiry. It imports only
the standard library and jinja2, never ggopt, so that it starts in a few tens of ms.

The environment is Hugging Face's ``apply_chat_template``: jinja2's immutable sandbox with
``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, ``raise_exception``,
``strftime_now`` and a ``tojson`` that keeps non-ASCII characters.

Protocol, over stdin/stdout: frames of an 8-byte big-endian length and ASCII JSON. A request
is read whole before any answer is written (so the parent never blocks writing it); each job
of a request gets its own answer frame ``{"ok": value}`` or ``{"error": kind, "message": m}``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from typing import Any, BinaryIO

__all__ = ["make_environment", "render", "spans"]

_HEADER = 8
# sentinels standing for each message's content in the one-render span search
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    """The current local time formatted, or the time ``SOURCE_DATE_EPOCH`` (the reproducible-
    builds variable: whole seconds since 1970, UTC) names when it is set, for renders that must
    not depend on the day (a template that prints today's date)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is None:
        return datetime.now().strftime(fmt)
    try:
        when = datetime.fromtimestamp(int(epoch), tz=timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise ValueError(f"strftime_now: SOURCE_DATE_EPOCH must be whole seconds since 1970, "
                         f"got {epoch[:40]!r}") from None
    return when.strftime(fmt)


def make_environment() -> Any:
    """Hugging Face's chat-template environment (jinja2's immutable sandbox)."""
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class TemplateFailure(Exception):
    """A template that does not compile or render (kind: ``syntax``, ``render``, ``memory``,
    ``recursion``, ``output``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def render(compiled: Any, messages: list[Any], add_generation_prompt: bool,
           variables: dict[str, Any], max_chars: int) -> str:
    """One rendering, its text at most ``max_chars`` long."""
    text = str(compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               **variables))
    if len(text) > max_chars:
        raise TemplateFailure("output", f"the rendering has {len(text)} characters, over the "
                                        f"limit of {max_chars}")
    return text


def _exact_spans(compiled: Any, messages: list[Any], variables: dict[str, Any],
                 max_chars: int) -> tuple[str, list[tuple[int, bool]]]:
    """Every prefix rendered: the cut after ``messages[:k]`` with the generation prompt and
    after ``messages[:k+1]``; each must extend the text before it."""
    cuts: list[tuple[int, bool]] = []
    done = ""
    for k, msg in enumerate(messages):
        answer = msg["role"] == "assistant"
        steps = [(messages[:k + 1], False, answer)]
        if answer:
            steps.insert(0, (messages[:k], True, False))
        for prefix, gen, trained in steps:
            text = render(compiled, prefix, gen, variables, max_chars)
            if not text.startswith(done):
                raise TemplateFailure("prefix", f"the rendering of messages[:{k + 1}] does not "
                                                f"extend that of the messages before it")
            if len(text) > len(done):
                cuts.append((len(text), trained))
            done = text
    return done, cuts


def _fast_spans(compiled: Any, messages: list[Any], variables: dict[str, Any],
                max_chars: int) -> tuple[str, list[tuple[int, bool]]] | None:
    """The cuts of :func:`_exact_spans` from one rendering, or None where its model does not
    hold. Each content is replaced by a unique sentinel to find where it lands; a message's
    end of turn and the generation prompt are measured on exact prefix renderings (the first
    message of each role, the first assistant message) and every sampled prefix is checked
    against the exact rendering (first ones, last ones, evenly spaced ones)."""
    if not all(isinstance(m.get("content"), str) and _OPEN not in m["content"]
               and _CLOSE not in m["content"] for m in messages):
        return None
    full = render(compiled, messages, False, variables, max_chars)
    marked = [dict(m, content=f"{_OPEN}{k}{_CLOSE}") for k, m in enumerate(messages)]
    skeleton = render(compiled, marked, False, variables, max_chars + 32 * len(messages))
    pieces = skeleton.split(_OPEN)
    if len(pieces) != len(messages) + 1:
        return None
    starts, ends = [], []
    rebuilt = [pieces[0]]
    pos = len(pieces[0])
    for k, piece in enumerate(pieces[1:]):
        label, sep, glue = piece.partition(_CLOSE)
        if label != str(k) or not sep or _CLOSE in glue:
            return None
        content = messages[k]["content"]
        starts.append(pos)
        pos += len(content)
        ends.append(pos)
        pos += len(glue)
        rebuilt += (content, glue)
    if "".join(rebuilt) != full:  # the template does more with a content than print it
        return None
    footer: dict[str, int] = {}
    prompt: int | None = None

    def prefix_end(k: int, gen: bool) -> int:
        return len(render(compiled, messages[:k], gen, variables, max_chars))

    for k, m in enumerate(messages):
        if m["role"] not in footer:
            footer[m["role"]] = prefix_end(k + 1, False) - ends[k]
        if m["role"] == "assistant" and prompt is None:
            prompt = starts[k] - prefix_end(k, True)
    n = len(messages)
    cuts: list[tuple[int, bool]] = []
    done = 0
    expect: list[tuple[int, bool, int]] = []  # (prefix length, generation prompt, cut)
    for k, m in enumerate(messages):
        answer = m["role"] == "assistant"
        steps = [(k + 1, False, ends[k] + footer[m["role"]], answer)]
        if answer:
            assert prompt is not None
            steps.insert(0, (k, True, starts[k] - prompt, False))
        for length, gen, cut, trained in steps:
            if cut < done or cut > len(full):
                return None
            if cut > done:
                cuts.append((cut, trained))
            done = cut
            expect.append((length, gen, cut))
    if done != len(full):
        return None
    step = max(1, len(expect) // 8)
    sample = set(range(min(6, len(expect)))) | set(range(max(0, len(expect) - 4), len(expect)))
    sample |= set(range(0, len(expect), step))
    for i in sorted(sample):
        length, gen, cut = expect[i]
        if length == n and not gen:
            continue  # the whole conversation: ``full`` itself
        if render(compiled, messages[:length], gen, variables, max_chars) != full[:cut]:
            return None
    return full, cuts


def spans(compiled: Any, messages: list[Any], variables: dict[str, Any], max_chars: int,
          fast_from: int) -> tuple[str, list[tuple[int, bool]]]:
    """The conversation's text and its cuts ``(end, trained)``: the pieces that rendering
    ``messages[:k]`` with the generation prompt and ``messages[:k+1]`` delimit, ``trained``
    for an assistant message's own piece. From ``fast_from`` messages on, from one rendering
    where its checks hold (:func:`_fast_spans`)."""
    if len(messages) >= fast_from:
        found = _fast_spans(compiled, messages, variables, max_chars)
        if found is not None:
            return found
    return _exact_spans(compiled, messages, variables, max_chars)


def _read_frame(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER)
    if len(header) < _HEADER:
        return None
    size = int.from_bytes(header, "big")
    return json.loads(stream.read(size).decode("ascii"))


def _write_frame(stream: BinaryIO, value: Any) -> None:
    data = json.dumps(value).encode("ascii")  # escapes: lone surrogates travel too
    stream.write(len(data).to_bytes(_HEADER, "big") + data)
    stream.flush()


def _failure(exc: BaseException) -> dict[str, str]:
    import jinja2

    if isinstance(exc, TemplateFailure):
        return {"error": exc.kind, "message": str(exc)}
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return {"error": "syntax", "message": f"{exc.message} (line {exc.lineno})"}
    if isinstance(exc, MemoryError):
        return {"error": "memory", "message": "out of memory"}
    if isinstance(exc, RecursionError):
        return {"error": "recursion", "message": "nested too deeply"}
    if isinstance(exc, jinja2.TemplateError):
        return {"error": "render", "message": str(exc)}
    return {"error": "render", "message": f"{type(exc).__name__}: {exc}"}


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    import resource

    init = _read_frame(stdin)
    if init is None:
        return
    sys.path[:] = init["path"]
    env = make_environment()
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    memory = init["memory"]
    if hard != resource.RLIM_INFINITY:
        memory = min(memory, hard)
    resource.setrlimit(resource.RLIMIT_AS, (memory, hard))
    max_chars = init["max_chars"]
    templates: dict[int, Any] = {}
    _write_frame(stdout, {"ok": "ready"})
    while True:
        request = _read_frame(stdin)
        if request is None:
            return
        op = request["op"]
        if op == "compile":
            try:
                templates[request["id"]] = env.from_string(request["template"])
                _write_frame(stdout, {"ok": None})
            except BaseException as exc:  # noqa: BLE001 (every failure is the template's)
                _write_frame(stdout, _failure(exc))
            continue
        compiled = templates[request["id"]]
        for job in request["jobs"]:
            try:
                if op == "render":
                    value: Any = render(compiled, job["messages"], job["add_generation_prompt"],
                                        job["variables"], max_chars)
                else:
                    value = spans(compiled, job["messages"], job["variables"], max_chars,
                                  job["fast_from"])
                answer = {"ok": value}
            except BaseException as exc:  # noqa: BLE001 (every failure is the template's)
                answer = _failure(exc)
            try:
                _write_frame(stdout, answer)
            except MemoryError as exc:
                _write_frame(stdout, _failure(exc))


if __name__ == "__main__":
    _die_with_parent()
    sys.setrecursionlimit(2000)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
