"""Make the small MNIST subset bundled in ``ggopt/models/mnist/subset``.

Run from the repository root::

    python -m tools.make_mnist_subset [MNIST_DIR]

``MNIST_DIR`` (default ``../shared/data/mnist`` from the repository root) holds the four
original gzip-compressed IDX files. The subset keeps the first 4000 training and the first
1000 test images with their labels, written as gzip level 9 IDX files without a timestamp,
so running the script again gives the same bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ggopt.io import idx

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT / ".." / "shared" / "data" / "mnist"
TARGET = ROOT / "ggopt" / "models" / "mnist" / "subset"
SUBSETS = {"train": 4000, "t10k": 1000}


def make_subset(source: Path, target: Path) -> list[Path]:
    """Write the first ``SUBSETS[split]`` images and labels of each split; return the files."""
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for split, count in SUBSETS.items():
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{split}-{kind}-ubyte.gz"
            data = idx.read(source / name)
            if len(data) < count:
                raise SystemExit(f"{source / name}: expected at least {count} items, "
                                 f"got {len(data)}")
            idx.write(target / name, data[:count])
            written.append(target / name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE,
                        help="folder with the original MNIST IDX .gz files")
    parser.add_argument("--target", type=Path, default=TARGET,
                        help="output folder (default: ggopt/models/mnist/subset)")
    args = parser.parse_args()
    for path in make_subset(args.source, args.target):
        print(f"{path}  {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
