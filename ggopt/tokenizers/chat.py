"""Chat templates (``tokenizer.chat_template``) rendered as Hugging Face's
``apply_chat_template`` renders them (the environment: :mod:`.chat_worker`), with the variables
``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` plus any extra ones
(``tools``, ...; JSON values).

A template comes from a file someone else wrote, so it is compiled and rendered under a budget
(:class:`TemplateLimits`): in a worker process whose address space is capped
(``RLIMIT_AS``), killed when one compilation or rendering takes longer than the limit. Every
failure (syntax, ``raise_exception``, a timeout, memory, recursion, a worker that dies) is an
InvalidValueError naming the template's source and the limit. One worker serves every
rendering of a process (restarted after a failure); a dataset's conversations go to it in
batches (:func:`chat_spans`).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ggopt.errors import InvalidValueError

__all__ = ["TemplateLimits", "render_chat", "chat_spans", "FAST_FROM"]

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_worker.py")
_HEADER = 8
_BATCH_CHARS = 1 << 22  # a request's content, at most (the worker reads a request whole)
FAST_FROM = 8  # conversations of this many messages and more: one rendering (chat_spans)


@dataclass(frozen=True)
class TemplateLimits:
    """The budget of one template: ``seconds`` of wall time per compilation and per rendering
    (a conversation), ``memory_mb`` of address space for the worker process (Python and jinja2
    take about 30 MB of it), ``max_chars`` characters per rendering. Raise them for huge
    conversations; the defaults bound a hostile template."""

    seconds: float = 10.0
    memory_mb: int = 1024
    max_chars: int = 1 << 26

    def __post_init__(self) -> None:
        for name, low in (("seconds", 0.01), ("memory_mb", 64), ("max_chars", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not value >= low:
                raise InvalidValueError(f"TemplateLimits.{name}: expected a number >= {low}, "
                                        f"got {value!r}")


DEFAULT_LIMITS = TemplateLimits()


class _Failed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Worker:
    """One worker process with its limits and the templates it has compiled."""

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.templates: dict[str, int] = {}
        self.proc = subprocess.Popen([sys.executable, "-I", _WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.send({"path": sys.path, "memory": limits.memory_mb << 20,
                   "max_chars": limits.max_chars})
        self.receive(max(limits.seconds, 30.0))  # the first start imports jinja2

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def send(self, value: Any) -> None:
        data = json.dumps(value).encode("ascii")
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(len(data).to_bytes(_HEADER, "big") + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Failed("died", self._death()) from None

    def _death(self) -> str:
        code = self.proc.wait()
        return f"the worker process died (exit status {code})"

    def _read(self, size: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        chunks = []
        while size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Failed("time", "")
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                raise _Failed("died", self._death())
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def receive(self, seconds: float) -> Any:
        deadline = time.monotonic() + seconds
        size = int.from_bytes(self._read(_HEADER, deadline), "big")
        if size > 8 * self.limits.max_chars + 4096:
            raise _Failed("output", f"an answer of {size} bytes")
        answer = json.loads(self._read(size, deadline).decode("ascii"))
        if "error" in answer:
            raise _Failed(answer["error"], answer["message"])
        return answer["ok"]


_lock = threading.Lock()
_FATAL = ("time", "died", "memory", "output", "recursion")  # the worker is restarted
_workers: dict[TemplateLimits, _Worker] = {}


@atexit.register
def _close_all() -> None:
    while _workers:
        _workers.popitem()[1].close()


def _worker(limits: TemplateLimits, template: str) -> tuple[_Worker, int]:
    worker = _workers.get(limits)
    if worker is not None and (not worker.alive() or len(worker.templates) > 32):
        worker.close()
        worker = None
    if worker is None:
        worker = _workers[limits] = _Worker(limits)
    if template not in worker.templates:
        ident = len(worker.templates)
        worker.send({"op": "compile", "id": ident, "template": template})
        try:
            worker.receive(limits.seconds)
        except _Failed as exc:
            raise _Failed("syntax" if exc.kind == "render" else exc.kind, str(exc)) from None
        worker.templates[template] = ident
    return worker, worker.templates[template]


def _error(kind: str, message: str, source: str, limits: TemplateLimits, item: str) -> \
        InvalidValueError:
    where = f"chat template of {source}" if source else "chat template"
    what = item or "the rendering"
    at = f" ({item})" if item else ""
    text = {
        "syntax": f"{where} does not compile: {message}",
        "time": f"{where}: compiling or rendering{at} took longer than the limit of "
                f"{limits.seconds:g} s (TemplateLimits.seconds)",
        "memory": f"{where}: {what} ran out of the memory limit of {limits.memory_mb} MB "
                  "(TemplateLimits.memory_mb)",
        "output": f"{where}: {what} is longer than the limit of {limits.max_chars} characters "
                  f"(TemplateLimits.max_chars): {message}",
        "recursion": f"{where} failed to render{at}: it nests too deeply (the worker's "
                     "recursion limit)",
        "died": f"{where}: {what} killed the worker process (memory limit "
                f"{limits.memory_mb} MB, TemplateLimits.memory_mb): {message}",
        "prefix": f"{where}{at}: {message}",
    }.get(kind, f"{where} failed to render{at}: {message}")
    return InvalidValueError(text)


def _run(template: str, op: str, jobs: Sequence[dict[str, Any]], limits: TemplateLimits,
         source: str, what: str) -> list[Any]:
    """``jobs`` through the worker, in batches of about ``_BATCH_CHARS``; each job's answer
    within ``limits.seconds``."""
    out: list[Any] = []
    with _lock:
        try:
            worker, ident = _worker(limits, template)
            start = 0
            while start < len(jobs):
                stop, size = start, 0
                while stop < len(jobs) and (stop == start or size < _BATCH_CHARS):
                    size += len(json.dumps(jobs[stop]["messages"]))
                    stop += 1
                worker.send({"op": op, "id": ident, "jobs": list(jobs[start:stop])})
                for i in range(start, stop):
                    try:
                        out.append(worker.receive(limits.seconds))
                    except _Failed as exc:
                        if exc.kind in _FATAL:
                            raise
                        # the worker still answers the rest of the batch: drain it
                        for _ in range(i + 1, stop):
                            try:
                                worker.receive(limits.seconds)
                            except _Failed:
                                pass
                        raise _Failed(exc.kind, str(exc)) from None
                start = stop
        except _Failed as exc:
            if exc.kind in _FATAL and limits in _workers:
                _workers.pop(limits).close()  # its state is unknown: a fresh worker next time
            item = f"{what} {len(out) + 1}" if what else ""
            raise _error(exc.kind, str(exc), source, limits, item) from None
        except (TypeError, ValueError) as exc:  # a variable JSON cannot carry
            raise InvalidValueError(f"chat template: the variables must be JSON values: "
                                    f"{exc}") from None
    return out


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


def _check_template(template: object) -> str:
    if not isinstance(template, str):
        raise InvalidValueError(f"chat template: expected a str, got {type(template).__name__}")
    return template


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = False, bos_token: str = "",
                eos_token: str = "", limits: TemplateLimits = DEFAULT_LIMITS,
                source: str = "", **variables: Any) -> str:
    """The text of ``messages`` (``[{"role": "user", "content": "Hi"}, ...]``) in ``template``,
    rendered under ``limits``.

    Raises
    ------
    InvalidValueError
        The template does not compile or fails while rendering (``raise_exception`` included,
        with jinja2's message), or exceeds a limit (the message names ``source``, the file the
        template came from, and the limit).
    """
    variables = dict(variables, bos_token=bos_token, eos_token=eos_token)
    job = {"messages": _check_messages(messages),
           "add_generation_prompt": bool(add_generation_prompt), "variables": variables}
    return str(_run(_check_template(template), "render", [job], limits, source, "")[0])


def chat_spans(template: str, conversations: Sequence[Sequence[Mapping[str, Any]]], *,
               bos_token: str = "", eos_token: str = "",
               limits: TemplateLimits = DEFAULT_LIMITS, source: str = "",
               fast_from: int = FAST_FROM) -> list[tuple[str, list[tuple[int, bool]]]]:
    """Each conversation's text and its cuts ``(end, trained)``: the pieces between the
    renderings of ``messages[:k]`` with the generation prompt and of ``messages[:k+1]`` (the
    assistant's message ``k`` and its end of turn are ``trained``; every rendering must extend
    the one before it). Conversations of ``fast_from`` messages or more are rendered once,
    the cuts found with sentinels and checked on sampled prefixes (else every prefix is
    rendered). One worker call for all of them (in batches).

    Raises
    ------
    InvalidValueError
        As :func:`render_chat`; a template whose shorter renderings are not prefixes of the
        longer ones (the assistant's text cannot be located).
    """
    if isinstance(fast_from, bool) or not isinstance(fast_from, int) or fast_from < 1:
        raise InvalidValueError(f"chat_spans: fast_from must be an int >= 1, got {fast_from!r}")
    variables = {"bos_token": bos_token, "eos_token": eos_token}
    jobs = [{"messages": _check_messages(msgs), "variables": variables, "fast_from": fast_from}
            for msgs in conversations]
    answers = _run(_check_template(template), "spans", jobs, limits, source, "conversation")
    return [(str(text), [(int(end), bool(trained)) for end, trained in cuts])
            for text, cuts in answers]
