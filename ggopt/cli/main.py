"""The ``ggopt`` command (also ``python -m ggopt``): one entry point for the command lines.

``ggopt finetune ...`` fine-tunes a llama GGUF (:mod:`ggopt.cli.finetune`); ``ggopt generate``,
``ggopt eval`` and ``ggopt tokenize`` run any llama GGUF (:mod:`ggopt.cli.llm_infer`);
``ggopt train`` trains a byte-level llama (:mod:`ggopt.cli.llm`); ``ggopt mnist train|eval``
runs ggml's MNIST example (:mod:`ggopt.cli.mnist`). A command's module is imported only when
it runs, so ``ggopt --version`` and ``ggopt --help`` start at once.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from .._version import __version__

__all__ = ["COMMANDS", "main"]

#: command -> (module under ggopt.cli, whether the command's name is passed on, help)
COMMANDS: dict[str, tuple[str, bool, str]] = {
    "finetune": ("finetune", False, "fine-tune a llama GGUF, full or LoRA, on text or chat"),
    "generate": ("llm", True, "sample text from a llama GGUF (KV cache)"),
    "eval": ("llm", True, "perplexity of a llama GGUF on text, as llama-perplexity"),
    "tokenize": ("llm", True, "print token ids, as llama-tokenize --ids"),
    "train": ("llm", True, "train a small byte-level llama on text, save it as GGUF"),
    "mnist": ("mnist", False, "ggml's MNIST example: train | eval"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: ggopt [-h] [--version] {{{','.join(COMMANDS)}}} ...", "",
             "ggml's training API (ggml-opt) in Python: fine-tune, run and train models.", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {entry[2]}" for name, entry in COMMANDS.items()]
    lines += ["", "`ggopt COMMAND --help` describes a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ggopt`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args and args[0] == "--version":
        print(f"ggopt {__version__}")
        return 0
    if not args or args[0] not in COMMANDS:
        got = f"unknown command {args[0]!r}" if args else "a command is required"
        print(f"{_usage()}\nggopt: error: {got}", file=sys.stderr)
        return 2
    module, pass_name, _ = COMMANDS[args[0]]
    run = importlib.import_module(f"{__package__}.{module}").main
    code: int = run(args if pass_name else args[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
