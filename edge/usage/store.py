"""What the edge asks of a usage store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edge.usage.record import Usage


@dataclass(frozen=True, slots=True)
class WriteId:
    """Which write of which writer a row is: the same on every retry of that row.

    A write can land and its answer still be lost (a timeout, a dropped connection), and then both
    the writer and boto3 send it again. A store applies each (writer, seq) once: it keeps the
    writer's last applied seq with the row and skips a write whose seq is not above it. A writer
    writes its rows one at a time, seq rising, so any seq at or below the kept one has landed.
    """

    writer: str  # one per UsageWriter (process start), random
    seq: int


class UsageStore(Protocol):
    async def add(self, usage: Usage, write: WriteId) -> bool:
        """Add the row's counts to the stored row of its (user, model, day), creating it if needed,
        once per `write`: False when that write had landed before (nothing added this time)."""
        ...

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        """Rows of `user` (None: everyone) with start <= day <= end ("" leaves a side open), sorted
        by user, day, model."""
        ...

    async def aclose(self) -> None: ...
