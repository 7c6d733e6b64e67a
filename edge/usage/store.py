"""What the edge asks of a usage store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edge.usage.page import Position, UsagePage
from edge.usage.record import Usage


@dataclass(frozen=True, slots=True)
class WriteId:
    """Which write of which writer a row is: the same on every retry of that row.

    A write can land and its answer still be lost (a timeout, a dropped connection), and then both
    the writer and boto3 send it again. A store applies each (writer, seq) once: it keeps the
    writer's last applied seq and skips a write whose seq is not above it. A writer's seqs rise in
    store order wherever the store keeps them (UsageStore.parallel_writes), so any seq at or below
    the kept one has landed.
    """

    writer: str  # one per UsageWriter (process start), random
    seq: int


class UsageRefused(Exception):
    """The store refuses this row itself (DynamoDB: a user name past its partition key's 2,048
    bytes): sent again, it fails the same way. The writer logs it whole and goes on, where a retry
    for ever held up every row queued behind it."""


class UsageStore(Protocol):
    # How many rows (each of its own user, model and day) the writer may have under way at once.
    # One where the store keeps a writer's last seq per writer (SQLite): a later seq landing first
    # would make an earlier one look like a repeat. Several where it keeps it per row (DynamoDB):
    # one at a time, a round trip each, a writer fell behind an edge ending a few hundred
    # requests of distinct users a second.
    parallel_writes: int

    async def add(self, usage: Usage, write: WriteId) -> bool:
        """Add the row's counts to the stored row of its (user, model, day), creating it if needed,
        once per `write`: False when that write had landed before (nothing added this time).
        Raises UsageRefused when no retry could write it."""
        ...

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        """Rows of `user` (None: everyone) with start <= day <= end ("" leaves a side open), sorted
        by user, day, model. All of them: `floodgate usage`'s export; the API reads page."""
        ...

    async def page(
        self, user: str | None, start: str, end: str, after: Position | None, limit: int
    ) -> UsagePage:
        """Up to `limit` of query's rows that follow the row at `after`, in an order the store keeps
        from one page to the next (user, day, model; DynamoDB's scan order for everyone's).
        BadCursor: `after` names no row this store could hold."""
        ...

    async def aclose(self) -> None: ...
