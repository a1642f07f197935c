"""Compare two ``pytest --collect-only -q`` listings by test function.

After moving tests between files, every test function of the old listing must still exist
(by function name) with at least as many cases (parametrizations), wherever it now lives::

    python -m pytest --collect-only -q > after.txt
    python tools/compare_test_counts.py before.txt after.txt

Either file may also be a per-function listing as ``COUNT path::name`` lines. Exits 1 and
names every function that disappeared or lost cases.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

_CASE = re.compile(r"^(?P<path>[^\s:]+\.py)::(?:(?P<cls>\w+)::)?(?P<name>\w+)(?:\[.*\])?$")
_COUNTED = re.compile(r"^\s*(?P<n>\d+)\s+(?P<case>\S+)$")


def count_cases(text: str) -> Counter[str]:
    """Cases per test function name (``Class.name`` for methods), summed over files."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        n, case = 1, line.strip()
        if m := _COUNTED.match(line):
            n, case = int(m["n"]), m["case"]
        if m := _CASE.match(case):
            key = f"{m['cls']}.{m['name']}" if m["cls"] else m["name"]
            counts[key] += n
    return counts


def compare(before: Counter[str], after: Counter[str]) -> list[str]:
    """The functions of ``before`` missing from ``after`` or with fewer cases there."""
    return [f"{name}: {n} -> {after.get(name, 0)}" for name, n in sorted(before.items())
            if after.get(name, 0) < n]


def main(argv: list[str]) -> int:
    before, after = (count_cases(Path(p).read_text()) for p in argv[1:3])
    lost = compare(before, after)
    print(f"before: {sum(before.values())} cases in {len(before)} functions; "
          f"after: {sum(after.values())} cases in {len(after)} functions")
    for line in lost:
        print("LOST", line)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
