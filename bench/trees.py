"""`--trees LABEL=DIR,...`: the checkouts a side-by-side bench serves the edge from (bench.streams'
`tree`), so a change and the code before it meet the same machine in one run."""

from __future__ import annotations

import sys
from pathlib import Path


def parse_trees(spec: str) -> list[tuple[str, Path | None]]:
    """`"before=/old,after=."` -> [("before", /old resolved), ("after", cwd)]; "" -> []. (None is
    the callers' own checkout, which they add themselves.)"""
    pairs = (t.split("=", 1) for t in spec.split(",") if t)
    trees: list[tuple[str, Path | None]] = [(label, Path(d).resolve()) for label, d in pairs]
    return trees


def tree_python(tree: Path | None) -> str:
    """The interpreter a tree's server runs on: the tree's own `.venv` where it has one (a checkout
    with other dependencies, or another Python: `--trees py311=/a,py312=/b`, each with its venv),
    else this bench's."""
    own = tree / ".venv" / "bin" / "python" if tree else None
    return str(own) if own and own.exists() else sys.executable
