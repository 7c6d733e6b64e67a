"""The Lua scripts Redis runs: one atomic step each (admit, charge, settle, restore), each prefixed
with clock.lua (the shared clock and key-expiry margin) and gcra.lua (the algorithm's arithmetic):
Redis scripts cannot import one another."""

from __future__ import annotations

from importlib.resources import files


def script_text(name: str) -> str:
    scripts = files(__package__)
    return "".join(scripts.joinpath(part).read_text() for part in ("clock.lua", "gcra.lua", f"{name}.lua"))
