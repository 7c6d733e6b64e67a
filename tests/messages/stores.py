"""Stores with a real SQLite store behind them and one fault in front: for the writer's tests."""

from __future__ import annotations

from typing import Any

import anyio

from edge.messages.message import StoredMessage
from edge.messages.sqlite import SQLiteMessageStore
from edge.messages.store import HistoryPage, MessageRefused


class GatedStore:
    """Holds every write until `gate` is set: a store that is slower than the traffic."""

    def __init__(self, inner: SQLiteMessageStore) -> None:
        self.inner = inner
        self.gate = anyio.Event()
        self.entered = anyio.Event()

    async def append(self, msg: StoredMessage) -> None:
        self.entered.set()
        await self.gate.wait()
        await self.inner.append(msg)

    async def history(self, conversation_id: str, user: str, limit: int = 100, **page: Any) -> HistoryPage:
        return await self.inner.history(conversation_id, user, limit, **page)

    async def aclose(self) -> None:
        await self.inner.aclose()


class FlakyStore:
    """Fails the first `failures` writes with a connection error, then writes for real."""

    def __init__(self, inner: SQLiteMessageStore, failures: int) -> None:
        self.inner = inner
        self.failures_left = failures
        self.attempts = 0

    async def append(self, msg: StoredMessage) -> None:
        self.attempts += 1
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ConnectionError("store unreachable")
        await self.inner.append(msg)

    async def history(self, conversation_id: str, user: str, limit: int = 100, **page: Any) -> HistoryPage:
        return await self.inner.history(conversation_id, user, limit, **page)

    async def aclose(self) -> None:
        await self.inner.aclose()


class RefusingStore:
    """Refuses the first message for good (as DynamoDB refuses an item it cannot hold), then writes."""

    def __init__(self, inner: SQLiteMessageStore) -> None:
        self.inner = inner
        self.refused = 0

    async def append(self, msg: StoredMessage) -> None:
        if not self.refused:
            self.refused += 1
            raise MessageRefused("Item size has exceeded the maximum allowed size")
        await self.inner.append(msg)

    async def history(self, conversation_id: str, user: str, limit: int = 100, **page: Any) -> HistoryPage:
        return await self.inner.history(conversation_id, user, limit, **page)

    async def aclose(self) -> None:
        await self.inner.aclose()
