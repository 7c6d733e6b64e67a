"""A bench flag that names things in a comma-separated list (`--paths local,triton`): checked
against what the command knows, so a misspelt name is refused before anything runs rather than
run as some other thing under its label, or found as a traceback minutes in."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable


def names_of(known: Iterable[str], *, empty_ok: bool = False) -> Callable[[str], str]:
    """An argparse `type` for a comma-separated list of `known` names; the text is kept as given.
    `empty_ok`: the command drops empty names (`--paths ""`: none beside what it always runs)."""
    allowed = tuple(known)

    def check(text: str) -> str:
        if unknown := [name for name in text.split(",") if name not in allowed and (name or not empty_ok)]:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown))}; known: {', '.join(allowed)}"
            )
        return text

    return check
