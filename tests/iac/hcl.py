"""Reading iac/ with python-hcl2: one module's blocks, and the module wiring of an environment."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import hcl2

IAC = Path(__file__).resolve().parents[2] / "iac"
MODULES = IAC / "modules"
EXAMPLE = IAC / "envs" / "example"

_REFERENCE = re.compile(r"^\$\{(var|module)\.([A-Za-z0-9_]+)(?:\.([A-Za-z0-9_]+))?\}$")


def _load(path: Path) -> dict[str, Any]:
    options = getattr(hcl2, "SerializationOptions", None)
    with path.open() as f:
        if options is None:  # python-hcl2 < 7 already returns unquoted strings
            return dict(hcl2.load(f))
        return dict(
            hcl2.load(
                f,
                serialization_options=options(
                    with_comments=False, explicit_blocks=False, strip_string_quotes=True
                ),
            )
        )


@dataclass(frozen=True)
class Module:
    path: Path
    blocks: dict[str, list[Any]]

    def resources(self, kind: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for entry in self.blocks.get("resource", []):
            found.update(entry.get(kind, {}))
        return found

    def resource(self, kind: str, name: str) -> dict[str, Any]:
        return self.resources(kind)[name]

    def data(self, kind: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for entry in self.blocks.get("data", []):
            found.update(entry.get(kind, {}))
        return found

    def variables(self) -> dict[str, dict[str, Any]]:
        return {k: v for entry in self.blocks.get("variable", []) for k, v in entry.items()}

    def outputs(self) -> dict[str, Any]:
        return {k: v["value"] for entry in self.blocks.get("output", []) for k, v in entry.items()}

    def locals(self) -> dict[str, Any]:
        return {k: v for entry in self.blocks.get("locals", []) for k, v in entry.items()}

    def calls(self) -> dict[str, dict[str, Any]]:
        return {k: v for entry in self.blocks.get("module", []) for k, v in entry.items()}


@cache
def module(path: Path) -> Module:
    blocks: dict[str, list[Any]] = {}
    for tf in sorted(path.glob("*.tf")):
        for key, value in _load(tf).items():
            blocks.setdefault(key, []).extend(value if isinstance(value, list) else [value])
    return Module(path, blocks)


def only(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The single nested block of a list-of-blocks attribute."""
    assert len(blocks) == 1, blocks
    return blocks[0]


def resolve(value: Any, env: Module, call: str) -> Any:
    """Follow `${var.x}` inside the module called `call` from `env` to what `env` passes it, and
    `${module.m.o}` to module m's output o: literal values come back, anything else unchanged."""
    if not isinstance(value, str):
        return value
    ref = _REFERENCE.match(value)
    if ref is None:
        return value
    kind, name, attr = ref.groups()
    if kind == "var":
        return resolve(env.calls()[call][name], env, call)
    source = env.calls()[name]["source"]
    return resolve(module((env.path / source).resolve()).outputs()[attr], env, name)
