"""The limiter is a library that knows nothing of HTTP or the edge's settings (issue 15): no
module in limiter/ imports the edge (or anything else of this project outside limiter/)."""

from __future__ import annotations

import ast
from pathlib import Path

import limiter

PROJECT_PACKAGES = {"edge", "gpu_container", "client", "bench", "tests"}


def test_no_limiter_module_imports_the_edge() -> None:
    root = Path(limiter.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in PROJECT_PACKAGES]
    assert len(list(root.rglob("*.py"))) > 5  # the walk found the package
    assert offenders == []
