"""Check the user documentation: links resolve, named commands exist.

Covers ``*.md`` at the repository root and in ``docs/``:

- every relative Markdown link ``[text](path#anchor)`` names an existing file and, when it
  has one, an anchor that a heading of that file produces (GitHub's slugs);
- every command a shell block or an inline code span names, ``ggopt <subcommand> ...`` and
  ``python -m ggopt.<module> ...`` / ``python -m bench.<module> ...``, answers ``--help``
  (exit 0), and
  every ``--option`` the docs give it appears in that help.

``ggopt <subcommand>`` runs as ``python -m ggopt.cli.main <subcommand>`` where that module
exists; otherwise those commands are reported as skipped, with the reason.

Usage: ``python tools/check_docs.py [ROOT]``; exits 1 and lists every problem.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE = re.compile(r"(`+)(.+?)\1")
_SHELL_LANGS = {"", "bash", "sh", "shell", "console", "sh-session"}
_WORD = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def doc_files(root: Path = ROOT) -> list[Path]:
    """The Markdown files checked: the root's and ``docs/``'s."""
    return sorted([*root.glob("*.md"), *(root / "docs").glob("*.md")])


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose_lines(text: str) -> Iterator[tuple[int, str, str | None]]:
    """``(line number, line, fence language)``; the language is None outside a fence."""
    fence: str | None = None
    lang = ""
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line.strip())
        if m and (fence is None or m[1].startswith(fence)):
            if fence is None:
                fence, lang = m[1][0] * 3, m[2].lower()
            else:
                fence = None
            continue
        yield n, line, (lang if fence is not None else None)


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of ``path`` produce (repeats get ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line, lang in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line) if lang is None else None
        if not m:
            continue
        base = slug(m[2])
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def check_links(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """Problems with the relative links of ``files`` (empty: all resolve); missing files are
    named by their path under ``root``."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        for n, line, lang in _prose_lines(path.read_text(encoding="utf-8")):
            if lang is not None:
                continue
            for target in _LINK.findall(_INLINE.sub("", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                where = f"{path.name}:{n}: link {target!r}"
                if not dest.exists():
                    name = dest.relative_to(root) if dest.is_relative_to(root) else dest
                    problems.append(f"{where}: no file '{name}'")
                    continue
                if anchor and dest.suffix == ".md":
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        problems.append(f"{where}: {dest.name} has no heading #{anchor}")
    return problems


@dataclasses.dataclass(frozen=True)
class Command:
    """A command named in the docs: ``argv`` runs its ``--help``; ``options`` the docs use."""

    argv: tuple[str, ...]
    options: frozenset[str]
    where: str


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment, comments=True)
    except ValueError:  # an unbalanced quote in prose: the words as written
        return segment.split()


def _command(words: list[str], where: str, cli: bool) -> Command | None:
    """The command ``words`` run (environment assignments and ``mpiexec -n N`` dropped), or
    None when it is not one of ggopt's."""
    words = [w.strip("[]") for w in words]
    while words and _ENV.match(words[0]):
        words = words[1:]
    if words and words[0] == "mpiexec":  # its options, up to the program it starts
        while words and not re.fullmatch(r"python3?|ggopt", words[0]):
            words = words[1:]
    if len(words) >= 3 and re.fullmatch(r"python3?", words[0]) and words[1] == "-m" and \
            re.fullmatch(r"(ggopt|bench)(\.\w+)*", words[2]):
        head, rest = ["-m", words[2]], words[3:]
    elif words and words[0] == "ggopt":
        head = ["-m", "ggopt.cli.main"] if cli else ["ggopt"]
        rest = words[1:]
    else:
        return None
    subs = []
    while rest and _WORD.match(rest[0]):
        subs.append(rest[0])
        rest = rest[1:]
    options = frozenset(w.split("=", 1)[0] for w in rest if re.match(r"^--[a-z]", w))
    return Command(tuple([*head, *subs]), options, where)


def commands(files: Iterable[Path], cli: bool = True) -> list[Command]:
    """Every ggopt command named in a shell block or an inline code span of ``files``.

    ``cli``: whether ``ggopt <subcommand>`` is runnable (``ggopt.cli.main`` exists); when not,
    such commands keep ``argv[0] == "ggopt"`` and :func:`check_commands` skips them."""
    found = []
    for path in files:
        pending = ""
        for n, line, lang in _prose_lines(path.read_text(encoding="utf-8")):
            if lang is None:
                segments = [m[2] for m in _INLINE.finditer(line)
                            if re.match(r"^(ggopt |python3? -m |mpiexec )", m[2])]
            elif lang in _SHELL_LANGS:
                text = pending + line.strip()
                if text.endswith("\\"):
                    pending = text[:-1] + " "
                    continue
                pending = ""
                segments = [re.sub(r"^\$\s+", "", text)]
            else:
                continue
            for segment in segments:
                for part in re.split(r"\s(?:&&|\|\||;|\|)\s", segment):
                    cmd = _command(_words(part), f"{path.name}:{n}", cli)
                    if cmd is not None:
                        found.append(cmd)
    return found


def cli_available(root: Path = ROOT) -> bool:
    """Whether the ``ggopt`` command's module, ``ggopt.cli.main``, exists in ``root``'s tree
    (the commands run from ``root``, so the tree's package is the one they import)."""
    return (root / "ggopt" / "cli" / "main.py").is_file()


def check_commands(cmds: Iterable[Command], root: Path = ROOT,
                   timeout: float = 120) -> tuple[list[str], list[str]]:
    """``(problems, skipped)``: each distinct command's ``--help`` must exit 0 and name every
    option the docs give it; ``ggopt ...`` commands without ``ggopt.cli.main`` are skipped."""
    by_argv: dict[tuple[str, ...], list[Command]] = {}
    for c in cmds:
        by_argv.setdefault(c.argv, []).append(c)
    problems, skipped = [], []
    for argv, uses in sorted(by_argv.items()):
        shown = " ".join(argv).replace("-m ggopt.cli.main", "ggopt")
        if argv[0] == "ggopt" and not cli_available(root):
            skipped.append(f"{shown} ({uses[0].where}): ggopt.cli.main does not exist in this "
                           f"tree (the ggopt command is not installed yet)")
            continue
        # `ggopt ...` runs as `python -m ggopt.cli.main ...`: the same code, installed or not
        python_argv = ["-m", "ggopt.cli.main", *argv[1:]] if argv[0] == "ggopt" else list(argv)
        run = subprocess.run([sys.executable, *python_argv, "--help"], capture_output=True,
                             text=True, cwd=root, timeout=timeout)
        if run.returncode != 0:
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:]
            problems.append(f"{uses[0].where}: `{shown} --help` exited {run.returncode}: "
                            f"{tail[0] if tail else ''}")
            continue
        known = set(re.findall(r"--[a-z][a-z0-9-]*", run.stdout))
        for c in uses:
            for option in sorted(c.options - known):
                problems.append(f"{c.where}: `{shown}` has no option {option}")
    return problems, skipped


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]).resolve() if args else ROOT
    files = doc_files(root)
    problems = check_links(files, root)
    cmd_problems, skipped = check_commands(commands(files, cli_available()), root)
    for line in skipped:
        print(f"skipped: {line}")
    for line in problems + cmd_problems:
        print(line)
    n = len(problems) + len(cmd_problems)
    print(f"{len(files)} files: {n} problem(s), {len(skipped)} command(s) skipped")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
