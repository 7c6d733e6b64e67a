"""A usage read on this edge counts every request this edge has ended: the rows it has queued for
the reader (everyone's, for the admin read) are written before the store is read, as a conversation's
history is (edge/routes/conversations.py). Written off the request path and gathered a quarter
second, a completion read at once was missing from /v1/usage: a billing check, a client showing its
spend, a test, each read a stale figure."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from edge.errors import ApiError
from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from edge.routes.usage import usage_response
from edge.usage.page import Position, UsagePage
from edge.usage.record import Usage
from edge.usage.store import UsageStore, WriteId
from edge.usage.writer import UsageWriter
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, events
from tests.support.live_server import LiveServer, start_server

ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"tiers": ROOMY_TIERS, "keys": {"admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path_factory.mktemp("usage_ryw"), settings) as live:
        yield live


def _ask(stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": stream,
        "stream_options": {"include_usage": True},
    }


def _complete(server: LiveServer, who: str, stream: bool) -> tuple[int, int]:
    """One request run to its end: the (prompt, completion) tokens it reports."""
    if not stream:
        body = _ask(False)
        del body["stream_options"]
        done = httpx.post(server.base_url + CHAT, json=body, headers=server.auth(who), timeout=60)
        assert done.status_code == 200, done.text
        usage = done.json()["usage"]
    else:
        with httpx.stream(
            "POST", server.base_url + CHAT, json=_ask(True), headers=server.auth(who), timeout=60
        ) as response:
            assert response.status_code == 200
            [usage] = [e["usage"] for e in events(response) if isinstance(e, dict) and e.get("usage")]
    return usage["prompt_tokens"], usage["completion_tokens"]


def _totals(rows: list[dict[str, Any]], user: str) -> tuple[int, int, int]:
    mine = [r for r in rows if r["user"] == user]
    return (
        sum(r["input_tokens"] for r in mine),
        sum(r["output_tokens"] for r in mine),
        sum(r["requests"] for r in mine),
    )


def _own(server: LiveServer, who: str) -> list[dict[str, Any]]:
    read = httpx.get(server.base_url + "/v1/usage", headers=server.auth(who), timeout=30)
    assert read.status_code == 200, read.text
    data: list[dict[str, Any]] = read.json()["data"]
    return data


def _everyones(server: LiveServer) -> list[dict[str, Any]]:
    read = httpx.get(server.base_url + "/v1/admin/usage", params={"limit": 100}, headers=ADMIN, timeout=30)
    assert read.status_code == 200, read.text
    data: list[dict[str, Any]] = read.json()["data"]
    return data


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_own_usage_read_at_once_counts_the_request_just_ended(server: LiveServer, stream: bool) -> None:
    before = _totals(_own(server, "paid"), "paid-user")
    prompt, completion = _complete(server, "paid", stream)
    after = _totals(_own(server, "paid"), "paid-user")
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (prompt, completion, 1)


def test_admin_usage_read_at_once_counts_everyones_requests_just_ended(server: LiveServer) -> None:
    before = _everyones(server)
    first = _complete(server, "free", False)
    second = _complete(server, "free2", True)
    after = _everyones(server)
    for user, (prompt, completion) in (("free-user", first), ("free-user-2", second)):
        was, now = _totals(before, user), _totals(after, user)
        assert (now[0] - was[0], now[1] - was[1], now[2] - was[2]) == (prompt, completion, 1)


class _StuckStore:
    """A store whose writes never answer: a read waiting for them must still be answered."""

    parallel_writes = 1

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def add(self, usage: Usage, write: WriteId) -> bool:
        await self.release.wait()
        return True

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        return []

    async def page(
        self, user: str | None, start: str, end: str, after: Position | None, limit: int
    ) -> UsagePage:
        return UsagePage([], False)

    async def aclose(self) -> None:
        self.release.set()


@pytest.mark.anyio
async def test_a_stuck_store_holds_a_read_only_its_wait() -> None:
    store = _StuckStore()
    writer = UsageWriter(store, 10, gather_s=3600, drain_timeout_s=0.01)
    writer.start()
    writer.record("ann", "m", 3, 4)
    assert await writer.written("ann", 0.05) is False
    assert await writer.written(None, 0.0) is False
    await store.aclose()
    await writer.aclose()


@pytest.mark.anyio
async def test_a_read_waits_only_for_its_own_users_rows(usage_store: UsageStore) -> None:
    writer = UsageWriter(usage_store, 10, gather_s=3600)
    writer.start()
    try:
        assert await writer.written("ann", 30) is True  # nothing queued: no wait at all
        writer.record("bob", "m", 1, 1)
        assert await writer.written("ann", 30) is True
        assert await usage_store.query("bob") == []  # bob's row still gathers
        writer.record("ann", "m", 3, 4)
        # A gather of an hour: the read has the batch written now, not an hour later.
        assert await writer.written("ann", 30) is True
        assert [(u.user, u.input_tokens, u.output_tokens) for u in await usage_store.query()] == [
            ("ann", 3, 4),
            ("bob", 1, 1),
        ]
        writer.record("cy", "m", 5, 6)
        assert await writer.written(None, 30) is True
        assert [u.user for u in await usage_store.query("cy")] == ["cy"]
    finally:
        await writer.aclose()


class _CountingStore(_StuckStore):
    """A stuck store that counts the rows handed to it: a batch the writer sent shows at once."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    async def add(self, usage: Usage, write: WriteId) -> bool:
        self.sent.append(usage.user)
        return await super().add(usage, write)


@pytest.mark.anyio
async def test_a_read_that_waits_no_time_leaves_the_gather_alone() -> None:
    """`usage_read_wait_s = 0` is an operator turning the wait off: a read then cut the gather
    anyway (a batch written per read, for nobody) and logged a warning per read."""
    store = _CountingStore()
    writer = UsageWriter(store, 10, gather_s=3600, drain_timeout_s=0.01)
    writer.start()
    try:
        writer.record("ann", "m", 3, 4)
        assert await writer.written("ann", 0) is False
        assert await writer.written(None, 0) is False
        # Turns of the loop, not time: a woken writer hands its batch to the store within three.
        for _ in range(20):
            await asyncio.sleep(0)
        assert store.sent == []  # still gathering, as with no read at all
        store.release.set()
        assert await writer.written("ann", 30) is True  # a read that waits still has it written
        assert store.sent == ["ann"]
    finally:
        await store.aclose()
        await writer.aclose()


class _WatchedWriter:
    """Stands in for the usage writer: says whether a read waited for it."""

    def __init__(self) -> None:
        self.waited: list[str | None] = []

    async def written(self, user: str | None, timeout_s: float) -> bool:
        self.waited.append(user)
        return True


@pytest.mark.anyio
async def test_a_read_refused_for_its_cursor_waits_for_no_write() -> None:
    """A malformed `after` is a 400 whatever is stored: it waited first (up to usage_read_wait_s
    on a slow store) and had the user's gathering usage written for an answer that reads nothing."""
    writer = _WatchedWriter()
    runtime: Any = SimpleNamespace(
        usage_writer=writer,
        settings=SimpleNamespace(keys=SimpleNamespace(usage_read_wait_s=2.0)),
        usage=_StuckStore(),
    )
    with pytest.raises(ApiError) as refused:
        await usage_response(runtime, "ann", "", "", None, "not-a-row-id")
    assert refused.value.status == 400
    assert writer.waited == []
    await usage_response(runtime, "ann", "", "", None, None)
    assert writer.waited == ["ann"]
