"""The Lua scripts Redis runs: one atomic step each (admit, charge, settle), each prefixed with
clock.lua (the shared clock and key-expiry margin): Redis scripts cannot import one another."""

from __future__ import annotations

from importlib.resources import files


def script_text(name: str) -> str:
    scripts = files(__package__)
    return scripts.joinpath("clock.lua").read_text() + scripts.joinpath(f"{name}.lua").read_text()
