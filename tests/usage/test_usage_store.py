"""Usage rows add up per (user, model, day) in either store, each write once however often it is
sent, and the writer loses none on close."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import structlog.testing
from botocore.exceptions import ClientError

from edge.keys.dynamodb import create_table_if_missing
from edge.usage.dynamodb import DynamoDBUsageStore
from edge.usage.page import position, row_id
from edge.usage.record import Usage, utc_day
from edge.usage.sqlite import SQLiteUsageStore
from edge.usage.store import UsageStore, WriteId
from edge.usage.writer import UsageWriter
from tests.keys.conftest import dynamodb_client
from tests.support.flaky_proxy import flaky_proxy

pytestmark = pytest.mark.anyio


async def test_rows_add_up_per_user_model_and_day(usage_store: UsageStore) -> None:
    writes = (WriteId("w", seq) for seq in itertools.count(1))
    await usage_store.add(Usage("alice", "m", "2026-01-01", 10, 5, 1), next(writes))
    await usage_store.add(Usage("alice", "m", "2026-01-01", 3, 2, 1), next(writes))
    await usage_store.add(Usage("alice", "m", "2026-01-02", 1, 1, 1), next(writes))
    await usage_store.add(Usage("bob", "m", "2026-01-01", 7, 0, 1), next(writes))
    assert await usage_store.query("alice") == [
        Usage("alice", "m", "2026-01-01", 13, 7, 2),
        Usage("alice", "m", "2026-01-02", 1, 1, 1),
    ]
    assert await usage_store.query("alice", start="2026-01-02") == [
        Usage("alice", "m", "2026-01-02", 1, 1, 1)
    ]
    assert [u.user for u in await usage_store.query(None, end="2026-01-01")] == ["alice", "bob"]


async def test_a_write_sent_again_adds_nothing_and_other_writers_still_add(usage_store: UsageStore) -> None:
    row = Usage("dora", "m", "2026-01-01", 10, 5, 1)
    assert await usage_store.add(row, WriteId("a", 1))
    assert not await usage_store.add(row, WriteId("a", 1))  # the same write again
    assert await usage_store.add(row, WriteId("b", 1))  # another writer's first write
    assert await usage_store.add(row, WriteId("a", 2))
    assert not await usage_store.add(row, WriteId("b", 1))
    assert await usage_store.query("dora") == [Usage("dora", "m", "2026-01-01", 30, 15, 3)]


async def test_a_write_whose_answer_is_lost_on_the_wire_counts_once(
    dynalite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DynamoDB applies the update, the connection drops before its answer, boto3 sends it again
    (as it does after a timeout): before WriteId the row was billed twice."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "test")
    table = f"usage-{secrets.token_hex(4)}"
    direct = dynamodb_client(dynalite_endpoint)
    create_table_if_missing(direct, table)  # type: ignore[arg-type]
    port = urlsplit(dynalite_endpoint).port
    assert port is not None
    with flaky_proxy(port, ["lose_answer"]) as proxy:
        store = DynamoDBUsageStore(dynamodb_client(proxy.base_url), table)  # type: ignore[arg-type]
        assert not await store.add(Usage("erin", "m", "2026-01-01", 10, 5, 1), WriteId("w", 1))
        assert proxy.connections == 2  # the lost answer, then boto3's retry
    rows = await DynamoDBUsageStore(direct, table).query("erin")  # type: ignore[arg-type]
    assert rows == [Usage("erin", "m", "2026-01-01", 10, 5, 1)]


class FlakyStore:
    """A usage store whose first writes fail: the writer must retry, not drop."""

    def __init__(self, inner: UsageStore, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def add(self, usage: Usage, write: WriteId) -> bool:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store hiccup")
        return await self.inner.add(usage, write)

    @property
    def parallel_writes(self) -> int:
        return self.inner.parallel_writes

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        return await self.inner.query(user, start, end)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_writer_sums_retries_and_writes_everything_before_close(usage_store: UsageStore) -> None:
    writer = UsageWriter(FlakyStore(usage_store, failures=2), 1000, base_backoff_s=0.001)
    writer.start()
    for i in range(200):
        assert writer.record("alice", "m", i, 1)
        if i % 50 == 0:
            await asyncio.sleep(0)  # let the worker take some batches mid-way
    await writer.aclose()
    assert not writer.record("alice", "m", 1, 1)  # closed: refused, not silently lost
    [row] = await usage_store.query("alice")
    assert (row.input_tokens, row.output_tokens, row.requests, row.day) == (
        sum(range(200)),
        200,
        200,
        utc_day(),
    )


class LostAnswerStore(FlakyStore):
    """A usage store whose first writes land but answer with an error, as after a timeout."""

    async def add(self, usage: Usage, write: WriteId) -> bool:
        added = await self.inner.add(usage, write)
        if self.failures:
            self.failures -= 1
            raise TimeoutError("the answer was lost")
        return added


async def test_the_writers_retry_of_a_write_that_landed_adds_nothing(usage_store: UsageStore) -> None:
    writer = UsageWriter(LostAnswerStore(usage_store, failures=3), 1000, base_backoff_s=0.001)
    writer.start()
    for i in range(10):
        assert writer.record("fay", "m", i, 2)
        await asyncio.sleep(0)  # the worker may take the rows in several batches
    await writer.aclose()
    [row] = await usage_store.query("fay")
    assert (row.input_tokens, row.output_tokens, row.requests) == (sum(range(10)), 20, 10)


class DownStore(FlakyStore):
    def __init__(self, inner: UsageStore) -> None:
        super().__init__(inner, failures=10**9)


async def test_a_store_down_through_shutdown_leaves_every_row_in_the_log(usage_store: UsageStore) -> None:
    writer = UsageWriter(
        DownStore(usage_store), 100, base_backoff_s=0.001, max_backoff_s=0.01, drain_timeout_s=0.2
    )
    writer.start()
    writer.record("ann", "m", 10, 20)
    writer.record("ann", "m", 1, 2)
    writer.record("bo", "m", 5, 5)
    with structlog.testing.capture_logs() as logs:
        await writer.aclose()
    unwritten = {
        e["user"]: (e["input_tokens"], e["output_tokens"], e["requests"])
        for e in logs
        if e["event"] == "usage_unwritten"
    }
    assert unwritten == {"ann": (11, 22, 2), "bo": (5, 5, 1)}
    assert await usage_store.query() == []


class OutageStore(FlakyStore):
    """A usage store down until `back` is set: `failing` is set at its first failed write."""

    def __init__(self, inner: UsageStore) -> None:
        super().__init__(inner, failures=0)
        self.failing = asyncio.Event()
        self.back = asyncio.Event()

    async def add(self, usage: Usage, write: WriteId) -> bool:
        if not self.back.is_set():
            self.failing.set()
            raise ConnectionError("store down")
        return await self.inner.add(usage, write)


async def test_an_outage_longer_than_the_queue_loses_no_request_of_a_known_row(
    usage_store: UsageStore,
) -> None:
    """While the store is down the writer retries its batch, and requests ending meanwhile wait. Each
    waited as a row of its own: 10,000 of them (usage_queue_size), under a minute of an edge ending
    a few hundred requests a second, and every request after was dropped, missing from the store
    and /v1/usage (logged only) though the limiter charged it. They now wait summed per user,
    model and day, as they are written: an outage holds one row per such key, however long."""
    store = OutageStore(usage_store)
    writer = UsageWriter(store, 10, base_backoff_s=0.001, max_backoff_s=0.01, gather_s=0.0)
    writer.start()
    assert writer.record("ann", "m", 1, 1)
    await asyncio.wait_for(store.failing.wait(), 10)  # the worker is retrying its batch
    with structlog.testing.capture_logs() as logs:
        recorded = [writer.record(user, "m", 3, 2) for _ in range(100) for user in ("ann", "bo")]
    assert all(recorded) and not [e for e in logs if e["event"] == "usage_dropped"]
    store.back.set()
    await asyncio.wait_for(writer.flush(), 10)
    await writer.aclose()
    rows = {r.user: (r.input_tokens, r.output_tokens, r.requests) for r in await usage_store.query()}
    assert rows == {"ann": (301, 201, 101), "bo": (300, 200, 100)}


class CountingStore(FlakyStore):
    def __init__(self, inner: UsageStore) -> None:
        super().__init__(inner, failures=0)
        self.writes: list[Usage] = []

    async def add(self, usage: Usage, write: WriteId) -> bool:
        self.writes.append(usage)
        return await super().add(usage, write)


class InFlightStore(FlakyStore):
    """Counts the writes under way at once."""

    def __init__(self, inner: UsageStore) -> None:
        super().__init__(inner, failures=0)
        self.now = self.most = 0

    async def add(self, usage: Usage, write: WriteId) -> bool:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await super().add(usage, write)
        finally:
            self.now -= 1


async def test_rows_of_distinct_users_go_out_together_where_the_store_allows_it(
    usage_store: UsageStore,
) -> None:
    """One at a time, a round trip each (DynamoDB: several milliseconds), the writer fell behind an
    edge ending a few hundred requests of distinct users a second, and at exit the rows of the
    streams the drain cut waited in line past the kill. DynamoDB keeps a writer's seq per row, so
    its rows go out together; SQLite keeps one per writer, so its go one at a time."""
    store = InFlightStore(usage_store)
    writer = UsageWriter(store, 1000, gather_s=3600)
    writer.start()
    for i in range(40):
        assert writer.record(f"user-{i}", "m", i, 2)
    await writer.aclose()
    rows = await usage_store.query()
    assert sorted((r.user, r.input_tokens, r.requests) for r in rows) == sorted(
        (f"user-{i}", i, 1) for i in range(40)
    )
    assert store.most == usage_store.parallel_writes
    assert usage_store.parallel_writes == (1 if isinstance(usage_store, SQLiteUsageStore) else 4)


async def test_rows_of_one_gather_reach_the_store_as_one_write_each_and_close_cuts_the_gather_short(
    usage_store: UsageStore,
) -> None:
    """The writer's worker gathers after a batch's first row (a store write per few requests was
    a visible part of a stream's set-up CPU); aclose writes the gathered rows at once, not an
    hour later."""
    store = CountingStore(usage_store)
    writer = UsageWriter(store, 1000, gather_s=3600)
    writer.start()
    for i in range(30):
        writer.record("alice" if i % 3 else "bob", "m", 1, 2)
        await asyncio.sleep(0)  # the worker runs between rows: it must keep gathering
    assert store.writes == []
    await writer.aclose()
    assert sorted((w.user, w.requests) for w in store.writes) == [("alice", 20), ("bob", 10)]


class AnswerHeldStore(FlakyStore):
    """Applies each write, then holds its answer until `answer` is set: a write that landed while
    its answer was still on the way when the writer's close ran out of time."""

    def __init__(self, inner: UsageStore) -> None:
        super().__init__(inner, failures=0)
        self.landed = asyncio.Event()
        self.answer = asyncio.Event()

    async def add(self, usage: Usage, write: WriteId) -> bool:
        added = await self.inner.add(usage, write)
        self.landed.set()
        await self.answer.wait()
        return added


async def test_replaying_the_log_of_a_close_cut_short_bills_each_request_once(
    usage_store: UsageStore,
) -> None:
    store = AnswerHeldStore(usage_store)
    writer = UsageWriter(store, 100, gather_s=0.0, drain_timeout_s=0.2)
    writer.start()
    writer.record("ann", "m", 10, 20)
    await store.landed.wait()
    writer.record("ann", "m", 1, 2)  # queued behind the write under way, same user, model and day
    with structlog.testing.capture_logs() as logs:
        await writer.aclose()
    for entry in (e for e in logs if e["event"] == "usage_unwritten"):
        row = Usage(
            entry["user"],
            entry["model"],
            entry["date"],
            entry["input_tokens"],
            entry["output_tokens"],
            entry["requests"],
        )
        # What billing's replay does: the logged WriteId where there is one, a fresh one otherwise.
        write = (
            WriteId(entry["writer"], entry["seq"]) if "writer" in entry else WriteId(secrets.token_hex(8), 1)
        )
        await usage_store.add(row, write)
    [row] = await usage_store.query("ann")
    assert (row.input_tokens, row.output_tokens, row.requests) == (11, 22, 2)


async def test_a_dropped_request_is_logged_whole(usage_store: UsageStore) -> None:
    """Billing replays a dropped request from the log: it needs its model (models are priced
    apart) and its day, as an unwritten row has them."""
    writer = UsageWriter(usage_store, 100)
    await writer.aclose()
    with structlog.testing.capture_logs() as logs:
        assert not writer.record("ann", "m", 10, 20)
    [dropped] = [e for e in logs if e["event"] == "usage_dropped"]
    assert Usage(
        dropped["user"],
        dropped["model"],
        dropped["date"],
        dropped["input_tokens"],
        dropped["output_tokens"],
        1,
    ) == Usage("ann", "m", utc_day(), 10, 20, 1)


async def test_a_row_the_store_refuses_holds_up_no_other_row(usage_store: UsageStore) -> None:
    """A user name longer than DynamoDB's partition key allows (2,048 bytes, `usage#` included):
    the store refuses that user's row (a ValidationException) however often it is sent. Retried
    for ever, it held up every row queued behind it, every user's, until the queue filled and all
    usage was dropped. Now it is logged whole (billing replays from the log) and the rest written."""
    writer = UsageWriter(usage_store, 100, base_backoff_s=0.001, max_backoff_s=0.01, gather_s=0.0)
    writer.start()
    long_user = "u" * 3000
    writer.record(long_user, "m", 10, 20)
    writer.record("bo", "m", 5, 5)
    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(writer.flush(), 10)  # before: never done, "bo" waited for ever
        await writer.aclose()
    rows = {r.user: (r.input_tokens, r.output_tokens, r.requests) for r in await usage_store.query()}
    assert rows["bo"] == (5, 5, 1)
    unwritten = [e for e in logs if e["event"] == "usage_unwritten"]
    # SQLite takes any name; DynamoDB refuses it, and the row is in the log instead.
    if long_user not in rows:
        assert [(e["user"], e["input_tokens"], e["output_tokens"], e["requests"]) for e in unwritten] == [
            (long_user, 10, 20, 1)
        ]
    else:
        assert rows[long_user] == (10, 20, 1) and unwritten == []


def _refuse_long_partition_keys_as_aws_does(client: object) -> None:
    """AWS answers a Query whose partition key value is past 2,048 bytes with a ValidationException
    ("Size of hashkey has exceeded the maximum size limit of2048 bytes", facebook/ThreatExchange
    issue 1324); dynalite checks a key's size on writes and GetItem only. The rule, added to the
    real client in front of dynalite."""

    def check(params: dict[str, Any], **_: object) -> None:
        for value in params.get("ExpressionAttributeValues", {}).values():
            if len(value.get("S", "").encode()) > 2048:
                error = {"Code": "ValidationException", "Message": "Size of hashkey has exceeded 2048 bytes"}
                raise ClientError({"Error": error}, "Query")

    client.meta.events.register("before-parameter-build.dynamodb.Query", check)  # type: ignore[attr-defined]


async def test_the_usage_of_a_name_too_long_for_the_store_is_an_empty_list(
    dynalite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user created before names were bounded (edge/keys/record.py MAX_USER_BYTES), or imported
    from a keys file, which takes any name: `usage#<user>` is past the partition key's 2,048 bytes,
    and the Query was a ValidationException, so that user's GET /v1/usage (and an admin's ?user=)
    was a 503 store_unavailable, Retry-After 1, for good. No row of such a name can be stored (the
    store refuses each, UsageRefused): their usage is none."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "test")
    table = f"usage-{secrets.token_hex(4)}"
    client = dynamodb_client(dynalite_endpoint)
    create_table_if_missing(client, table)  # type: ignore[arg-type]
    _refuse_long_partition_keys_as_aws_does(client)
    store = DynamoDBUsageStore(client, table)  # type: ignore[arg-type]
    await store.add(Usage("ann", "m", "2026-01-01", 1, 2, 1), WriteId("w", 1))
    assert await store.query("u" * 3000) == []
    assert await store.query("u" * 3000, start="2026-01-01", end="2026-12-31") == []
    assert await store.query("ann") == [Usage("ann", "m", "2026-01-01", 1, 2, 1)]


async def test_rows_are_read_a_page_at_a_time(usage_store: UsageStore) -> None:
    writes = (WriteId("w", n) for n in range(1, 100))
    rows = [
        Usage(user, model, day, 1, 1, 1)
        for user in ("alice", "bob")
        for day in ("2026-01-01", "2026-01-02", "2026-01-03")
        for model in ("m", "n")
    ]
    for row in rows:
        await usage_store.add(row, next(writes))

    for user, start, end in (
        ("alice", "", ""),
        ("bob", "2026-01-02", "2026-01-02"),
        (None, "2026-01-02", ""),
    ):
        wanted = await usage_store.query(user, start, end)
        assert wanted  # what the whole answer was: the pages hold the same rows, once each
        seen: list[Usage] = []
        after: str | None = None
        while True:
            page = await usage_store.page(user, start, end, None if after is None else position(after), 2)
            assert len(page.rows) <= 2
            seen += page.rows
            if not page.has_more:
                break
            after = row_id(page.rows[-1])
        assert sorted(seen, key=lambda r: (r.user, r.day, r.model)) == wanted
    assert (await usage_store.page("carol", "", "", None, 5)).rows == []


def test_a_row_id_names_its_row_and_nothing_else_is_one() -> None:
    row = Usage("ä/\u00e9 user", "m#1", "2026-01-01", 1, 1, 1)
    assert position(row_id(row)) == ("ä/\u00e9 user", "2026-01-01", "m#1")
    for bad in ("", "usage_", "usage_!!", "key_abc", "usage_" + "e30"):
        with pytest.raises(ValueError):
            position(bad)


async def test_a_cursor_outside_the_day_range_pages_as_the_rows_after_it(usage_store: UsageStore) -> None:
    """A client that narrows its range between pages, or sends a row id of another range, is given
    the range's rows that follow the cursor's row, as on any page. On DynamoDB the cursor's row key
    was the Query's ExclusiveStartKey outside its sort-key condition: a ValidationException, the
    request a 500."""
    writes = (WriteId("w", n) for n in range(1, 100))
    for day in ("2026-01-01", "2026-01-02", "2026-01-03"):
        await usage_store.add(Usage("alice", "m", day, 1, 1, 1), next(writes))
    before = ("alice", "2026-01-01", "m")
    past = ("alice", "2026-01-03", "m")
    for start, end in (("2026-01-02", "2026-01-03"), ("2026-01-02", "")):
        page = await usage_store.page("alice", start, end, before, 10)
        assert [r.day for r in page.rows] == ["2026-01-02", "2026-01-03"]
        assert not page.has_more
    for start, end in (("2026-01-01", "2026-01-02"), ("", "2026-01-02")):
        page = await usage_store.page("alice", start, end, past, 10)
        assert page.rows == []
        assert not page.has_more


async def test_a_range_whose_start_follows_its_end_is_an_empty_page(usage_store: UsageStore) -> None:
    """A start after the end (a client swapping them, or narrowing one past the other between
    pages) names no day: SQLite answers an empty page. On DynamoDB the Query's BETWEEN had its
    lower bound above its upper, a ValidationException: GET /v1/usage a 503 that no retry mends."""
    await usage_store.add(Usage("alice", "m", "2026-01-02", 1, 1, 1), WriteId("w", 1))
    for after in (None, ("alice", "2026-01-02", "m")):
        page = await usage_store.page("alice", "2026-01-03", "2026-01-01", after, 10)
        assert page.rows == []
        assert not page.has_more


async def test_a_cursor_of_another_user_pages_as_the_rows_after_it(usage_store: UsageStore) -> None:
    """Rows are in (user, day, model) order on one user's pages too: an operator who carries the
    everyone listing's last_id (or another user's) into ?user=bob is given bob's rows that follow
    it, as SQLite's keyset answers. On DynamoDB a cursor of any other user was an empty page,
    has_more false: bob, whose name sorts after it, read as having used nothing."""
    writes = (WriteId("w", n) for n in range(1, 100))
    for user, day in (("alice", "2026-01-01"), ("bob", "2026-01-01"), ("bob", "2026-01-02")):
        await usage_store.add(Usage(user, "m", day, 1, 1, 1), next(writes))
    await usage_store.add(Usage("zed", "m", "2026-01-01", 1, 1, 1), next(writes))
    page = await usage_store.page("bob", "", "", ("alice", "2026-01-01", "m"), 10)
    assert [(r.user, r.day) for r in page.rows] == [("bob", "2026-01-01"), ("bob", "2026-01-02")]
    assert not page.has_more
    page = await usage_store.page("bob", "", "", ("alice", "2026-01-01", "m"), 1)
    assert [(r.user, r.day) for r in page.rows] == [("bob", "2026-01-01")]
    assert page.has_more
    page = await usage_store.page("bob", "2026-01-02", "", ("alice", "2026-01-03", "m"), 10)
    assert [(r.user, r.day) for r in page.rows] == [("bob", "2026-01-02")]
    page = await usage_store.page("bob", "", "", ("zed", "2026-01-01", "m"), 10)
    assert page.rows == []
    assert not page.has_more


async def test_the_sqlite_store_forgets_writers_past_their_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process start is a writer of its own, and `usage_writes` kept a row for each for as
    long as the file lived: it grew by a row per edge (per worker) start, without end. A writer is
    now forgotten WRITER_KEPT_S after its last write, a writer of the release before (no time kept)
    as long after the file is first opened by this one; a writer still writing is kept."""
    path = tmp_path / "keys.db"
    now = time.time()
    with contextlib.closing(sqlite3.connect(path)) as db:  # a file of the release before
        db.execute("CREATE TABLE usage_writes (writer TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID")
        db.execute("INSERT INTO usage_writes VALUES ('before', 4)")
        db.commit()
    row = Usage("erin", "m", "2026-01-01", 1, 1, 1)
    # A month's process starts, each writing once: the clock is the one thing set here.
    for day, writer in [(0, "a"), (10, "b"), (20, "c")]:
        monkeypatch.setattr(time, "time", lambda day=day: now + day * 86400)
        store = SQLiteUsageStore(path)
        assert await store.add(row, WriteId(writer, 1))
        await store.aclose()
    monkeypatch.setattr(time, "time", lambda: now + 86400 * 32)  # past a's 30 days, not b's
    store = SQLiteUsageStore(path)
    try:
        assert await store.add(row, WriteId("d", 1))
        assert not await store.add(row, WriteId("c", 1))  # a writer kept still repeats nothing
    finally:
        await store.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db:
        writers = sorted(w for (w,) in db.execute("SELECT writer FROM usage_writes"))
    assert writers == ["b", "c", "d"]


async def test_a_commit_that_fails_leaves_the_sqlite_store_writing(tmp_path: Path) -> None:
    """A COMMIT that failed (a full disk, an I/O error; here SQLite's own authorizer refuses it)
    left its transaction open: every later write failed at its BEGIN ("cannot start a transaction
    within a transaction"), and no usage was written again until a restart."""
    store = SQLiteUsageStore(tmp_path / "keys.db")
    conn = store._conn  # the store's own connection is what must fail its COMMIT

    def no_commit(action: int, arg1: str | None, *_: object) -> int:
        refused = action == sqlite3.SQLITE_TRANSACTION and (arg1 or "").upper() == "COMMIT"
        return sqlite3.SQLITE_DENY if refused else sqlite3.SQLITE_OK

    day = utc_day()
    conn.set_authorizer(no_commit)
    with pytest.raises(sqlite3.DatabaseError):
        await store.add(Usage("ana", "m", day, 5, 1, 1), WriteId("w", 1))
    conn.set_authorizer(None)

    assert await store.add(Usage("ana", "m", day, 7, 2, 1), WriteId("w", 2))
    assert [(u.input_tokens, u.output_tokens) for u in await store.query("ana")] == [(7, 2)]
    await store.aclose()
