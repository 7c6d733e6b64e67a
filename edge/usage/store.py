"""What the edge asks of a usage store."""

from __future__ import annotations

from typing import Protocol

from edge.usage.record import Usage


class UsageStore(Protocol):
    async def add(self, usage: Usage) -> None:
        """Add the row's counts to the stored row of its (user, model, day), creating it if needed."""
        ...

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        """Rows of `user` (None: everyone) with start <= day <= end ("" leaves a side open), sorted
        by user, day, model."""
        ...

    async def aclose(self) -> None: ...
