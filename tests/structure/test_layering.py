"""The layers import downwards only: `limiter/` (a library that knows nothing of HTTP) and
`gpu_container/` (what runs on a GPU host) never import the edge, the client or the tests.

Read from the source (every import statement, function-level ones too, and importlib calls with a
literal name), not from what happens to be imported at run time, so that an import on a path no
test takes is caught as well.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.structure.imports import ROOT, imports_in, package_of

LOWER_LAYERS = ("limiter", "gpu_container")
FORBIDDEN = ("edge", "floodgate_client", "client", "bench", "tests")


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
        for name in imports_in(path.read_text(), package_of(path))
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
    assert imports_in(source, "gpu_container.triton") == {
        "edge.app",
        "edge.config",
        "edge.pipeline",
        "importlib",
        "gpu_container.triton.engine",
        "gpu_container",
    }
