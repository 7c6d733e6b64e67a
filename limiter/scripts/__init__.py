"""The Lua scripts Redis runs: one atomic step each (admit, charge, settle)."""

from __future__ import annotations

from importlib.resources import files


def script_text(name: str) -> str:
    return files(__package__).joinpath(f"{name}.lua").read_text()
