"""The layers import downwards only: `limiter/` (a library that knows nothing of HTTP) and
`gpu_container/` (what runs on a GPU host) never import the edge, the client or the tests.

Read from the source (every import statement, function-level ones too, and importlib calls with a
literal name), not from what happens to be imported at run time, so that an import on a path no
test takes is caught as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOWER_LAYERS = ("limiter", "gpu_container")
FORBIDDEN = ("edge", "floodgate_client", "client", "bench", "tests")


def _package_of(path: Path) -> str:
    """The package a file's relative imports resolve against."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1])


def _imports_in(source: str, package: str) -> set[str]:
    """The absolute module names a source imports: statements at any depth, and importlib calls."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `from .x` is this package's x, `from ..x` its parent's
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _sources() -> list[Path]:
    return sorted(p for layer in LOWER_LAYERS for p in (ROOT / layer).rglob("*.py"))


def test_the_lower_layers_have_sources_to_check() -> None:
    assert {p.relative_to(ROOT).parts[0] for p in _sources()} == set(LOWER_LAYERS)


@pytest.mark.parametrize("layer", LOWER_LAYERS)
def test_a_lower_layer_never_imports_the_edge(layer: str) -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in _sources()
        if path.relative_to(ROOT).parts[0] == layer
        for name in _imports_in(path.read_text(), _package_of(path))
        if name.split(".")[0] in FORBIDDEN
    )
    assert offending == [], "\n".join(offending)


def test_the_walk_sees_every_kind_of_import() -> None:
    """The check itself: top-level, function-level, relative and importlib imports all count."""
    source = (
        "import edge.app\n"
        "def f():\n    from edge.config import Settings\n"
        "import importlib\nimportlib.import_module('edge.pipeline')\n"
        "from .engine import types\nfrom .. import limiter\n"
    )
    assert _imports_in(source, "gpu_container.triton") == {
        "edge.app",
        "edge.config",
        "edge.pipeline",
        "importlib",
        "gpu_container.triton.engine",
        "gpu_container",
    }
