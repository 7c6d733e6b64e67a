"""The MessageStore contract, run against SQLite and DynamoDB (dynalite) alike."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
import string
import time
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError

from edge.messages.dynamodb import DynamoDBMessageStore, owned_partition
from edge.messages.message import StoredMessage, new_message
from edge.messages.sqlite import SWEEP_BATCH, SQLiteMessageStore
from edge.messages.store import PAGE_CHARS, HistoryPage, MessageStore
from tests.messages.conftest import TABLE, dynamodb_store

pytestmark = pytest.mark.anyio


def conversation() -> str:
    return f"c_{uuid.uuid4().hex}"


async def test_history_returns_what_was_appended_in_order(store: MessageStore) -> None:
    conv = conversation()
    asked = new_message(conv, "alice", "user", "Explain TTFT", "r_1")
    answered = new_message(conv, "alice", "assistant", "Time to first token…", "r_1", finish_reason="stop")
    await store.append(asked)
    await store.append(answered)

    assert (await store.history(conv, "alice")).messages == [asked, answered]


async def test_another_users_conversation_is_empty(store: MessageStore) -> None:
    conv = conversation()
    await store.append(new_message(conv, "alice", "user", "private", "r_1"))

    assert (await store.history(conv, "mallory")).messages == []
    assert (await store.history(conversation(), "alice")).messages == []


async def test_limit_keeps_the_first_messages_in_the_order_asked(store: MessageStore) -> None:
    conv = conversation()
    written = [new_message(conv, "alice", "user", f"m{i}", f"r_{i}") for i in range(7)]
    for msg in written:
        await store.append(msg)

    assert await store.history(conv, "alice", limit=3) == HistoryPage(written[:3], has_more=True)
    latest = await store.history(conv, "alice", limit=3, order="desc")
    assert latest == HistoryPage(written[:-4:-1], has_more=True)
    assert await store.history(conv, "alice", limit=7) == HistoryPage(written, has_more=False)


async def test_a_message_past_the_pages_text_budget_alone_still_says_more_follow(store: MessageStore) -> None:
    """A page ends after its first message however long (PAGE_CHARS): one longer than that alone
    (a request body an operator let past 4 MB) was read with nothing after it, and its page said
    has_more false: the messages after it were never listed, nor reachable by paging."""
    conv = conversation()
    written = [
        new_message(conv, "alice", "user", "x" * (PAGE_CHARS + 1), "r_0"),
        new_message(conv, "alice", "assistant", "short", "r_0"),
    ]
    for msg in written:
        await store.append(msg)

    assert await store.history(conv, "alice") == HistoryPage(written[:1], has_more=True)
    latest = await store.history(conv, "alice", order="desc")
    assert latest == HistoryPage(written[1:], has_more=True)
    after = await store.history(conv, "alice", after=written[0].message_id)
    assert after == HistoryPage(written[1:], has_more=False)


async def test_appending_the_same_message_twice_keeps_one(store: MessageStore) -> None:
    conv = conversation()
    msg = new_message(conv, "alice", "assistant", "partial", "r_1", finish_reason="cancelled")
    await store.append(msg)
    await store.append(msg)

    assert (await store.history(conv, "alice")).messages == [msg]


async def test_owner_filter_does_not_starve_the_limit(store: MessageStore) -> None:
    # Another user's rows under the same conversation id sit between the owner's rows and the end
    # of the conversation: the owner must still get their messages, past any page boundary.
    conv = conversation()
    mine = [new_message(conv, "alice", "user", f"mine{i}", "r_a") for i in range(3)]
    for msg in mine:
        await store.append(msg)
    for i in range(230):
        await store.append(new_message(conv, "mallory", "user", f"noise{i}", "r_m"))

    assert (await store.history(conv, "alice", limit=2, order="desc")).messages == mine[:-3:-1]
    assert len((await store.history(conv, "mallory", limit=500)).messages) == 230


async def test_unicode_and_empty_content_round_trip(store: MessageStore) -> None:
    conv = conversation()
    now = float(int(time.time())) + 0.5  # written now: a 1970 one is past any TTL
    msg = StoredMessage(conv, "ünï", "01J0000000000000000000000A", "assistant", "", "r_1", now, "length")
    odd = dataclasses.replace(msg, message_id="01J0000000000000000000000B", content="é 🚀 \n\t\"'")
    await store.append(msg)
    await store.append(odd)

    assert (await store.history(conv, "ünï")).messages == [msg, odd]


async def test_no_message_is_served_past_its_ttl(store: MessageStore) -> None:
    """DynamoDB deletes an expired item when it gets to it (days later, in AWS; dynalite never does),
    and a query returns it until then; SQLite has no TTL of its own: in neither may a prompt past
    ttl_days come back."""
    conv = conversation()
    old = dataclasses.replace(new_message(conv, "alice", "user", "an old secret", "r1"), created_at=0.0)
    await store.append(old)  # its TTL (90 days after 1970) ran out long ago
    fresh = new_message(conv, "alice", "user", "today", "r2")
    await store.append(fresh)
    assert [m.content for m in (await store.history(conv, "alice")).messages] == ["today"]


async def test_sqlite_deletes_what_outlived_its_ttl(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = SQLiteMessageStore(path, ttl_s=86400)
    conv = conversation()
    await store.append(
        dataclasses.replace(new_message(conv, "alice", "user", "a secret", "r1"), created_at=0.0)
    )
    await store.append(new_message(conv, "alice", "user", "today", "r2"))
    await store.aclose()
    with sqlite3.connect(path) as db:
        assert [row[0] for row in db.execute("SELECT content FROM messages")] == ["today"]


async def test_sqlite_sweeps_a_backlog_of_expired_messages_a_batch_per_write(tmp_path: Path) -> None:
    """One DELETE of every expired row held the file's write lock until it ended (9 s for 300,000
    rows): the other workers sharing the file failed their writes with "database is locked" and
    this one's history reads waited. Each write now deletes a batch at most; those after it, the
    rest, and a message still within its TTL is kept."""
    path = tmp_path / "m.db"
    SQLiteMessageStore(path)  # the file and its schema
    expired = 2 * SWEEP_BATCH + SWEEP_BATCH // 2
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO messages (conversation_id, user, message_id, role, content, request_id, created_at)"
            " VALUES (?, 'alice', ?, 'user', 'old', 'r', 0.0)",
            ((f"c{i % 7}", f"{i:026d}") for i in range(expired)),
        )
    store = SQLiteMessageStore(path, ttl_s=86400)

    def left() -> int:
        with sqlite3.connect(path) as db:
            return int(db.execute("SELECT count(*) FROM messages WHERE created_at = 0.0").fetchone()[0])

    conv = conversation()
    kept = [new_message(conv, "alice", "user", f"today {i}", f"r{i}") for i in range(4)]
    remaining = []
    for msg in kept:
        await store.append(msg)
        remaining.append(left())
    assert (await store.history(conv, "alice")).messages == kept
    await store.aclose()
    assert remaining == [expired - SWEEP_BATCH, expired - 2 * SWEEP_BATCH, 0, 0]


async def test_a_prompt_over_a_dynamodb_item_is_kept_whole(store: MessageStore) -> None:
    """A request body may be 1 MiB; a DynamoDB item at most 400 KB."""
    conv = conversation()
    long = new_message(conv, "alice", "user", "a long document, pasted whole. " * 15_000, "r1")  # 465 KB
    await store.append(long)

    assert (await store.history(conv, "alice")).messages == [long]


async def test_dynamodb_keeps_what_fits_of_a_message_that_does_not_even_compressed(
    dynalite_endpoint: str,
) -> None:
    store = dynamodb_store(dynalite_endpoint, f"big-{uuid.uuid4().hex[:8]}")
    await store.create_table_if_missing()
    conv = conversation()
    noise = "".join(random.Random(7).choices(string.printable[:94], k=600_000))  # hardly compressible
    try:
        await store.append(new_message(conv, "alice", "user", noise, "r1"))
        (kept,) = (await store.history(conv, "alice")).messages
    finally:
        await store.aclose()
    assert kept.truncated
    assert 300_000 < len(kept.content) < len(noise) and noise.startswith(kept.content)


async def test_another_users_read_of_a_long_conversation_reads_none_of_it(
    store: MessageStore,
) -> None:
    """Clients choose conversation ids: another user's read of one ("default" may be everyone's)
    stepped over every message of it before the owner check dropped them, so its 404 came as late
    as the conversation was long (a timing oracle; on DynamoDB, reads billed to the store). Counted
    here as the work the store does: SQLite's VM steps, DynamoDB's scanned items."""
    long, missing = conversation(), conversation()
    for i in range(300):
        await store.append(new_message(long, "alice", "user", f"m{i}", f"r_{i}"))
    work = _work_counter(store)
    reads: dict[str, int] = {}
    for name, conv in (("other's", long), ("missing", missing)):
        work.clear()
        assert (await store.history(conv, "mallory")).messages == []
        reads[name] = sum(work)
    assert reads["other's"] <= reads["missing"] + 10, reads
    assert len((await store.history(long, "alice", limit=500)).messages) == 300


def _work_counter(store: MessageStore) -> list[int]:
    """A list the store's own work is appended to as it reads (see the test above)."""
    work: list[int] = []
    if isinstance(store, SQLiteMessageStore):
        store._conn.set_progress_handler(lambda: work.append(1) or 0, 1)
    else:
        dynamo = cast(DynamoDBMessageStore, store)

        def scanned(parsed: dict[str, Any], **_: Any) -> None:
            work.append(int(parsed.get("ScannedCount", 0)))

        dynamo._client.meta.events.register("after-call.dynamodb.Query", scanned)
    return work


async def test_dynamodb_reads_a_conversation_written_before_partitions_named_their_owner(
    dynalite_endpoint: str,
) -> None:
    """Messages written before are kept under the client's id alone: still read, in order with
    those written since."""
    store = dynamodb_store(dynalite_endpoint)
    await store.create_table_if_missing()
    conv = conversation()
    before = new_message(conv, "alice", "user", "asked before", "r_1")
    item = _legacy_item(before)
    try:
        store._client.put_item(TableName=TABLE, Item=item)
        store._client.put_item(
            TableName=TABLE, Item=_legacy_item(new_message(conv, "bob", "user", "bob's", "r_b"))
        )
        after = new_message(conv, "alice", "assistant", "answered since", "r_1", finish_reason="stop")
        await store.append(after)
        assert (await store.history(conv, "alice")).messages == [before, after]
        assert (await store.history(conv, "alice", order="desc", limit=1)).messages == [after]
        assert [m.content for m in (await store.history(conv, "bob")).messages] == ["bob's"]
    finally:
        await store.aclose()


def _legacy_item(msg: StoredMessage) -> dict[str, Any]:
    """The item as the release before wrote it: the client's id as the partition key."""
    return {
        "conversation_id": {"S": msg.conversation_id},
        "message_id": {"S": msg.message_id},
        "owner": {"S": msg.user},
        "role": {"S": msg.role},
        "content": {"S": msg.content},
        "request_id": {"S": msg.request_id},
        "created_at": {"N": repr(msg.created_at)},
        "expires_at": {"N": str(int(msg.created_at) + 3600)},
        **({"finish_reason": {"S": msg.finish_reason}} if msg.finish_reason else {}),
    }


async def test_a_conversation_id_spelled_like_a_partition_reads_no_other(dynalite_endpoint: str) -> None:
    """The read of the ids written before partitions named their owner takes the client's id as a
    partition: an id spelled as another user's partition ("5:alice:trip", as they were named at
    first) read that user's conversation (its items scanned, its 404 late; alice's own id of that
    name answered with "trip")."""
    store = dynamodb_store(dynalite_endpoint)
    await store.create_table_if_missing()
    trip = conversation()
    try:
        for i in range(50):
            await store.append(new_message(trip, "alice", "user", f"m{i}", f"r{i}"))
        work = _work_counter(store)
        for forged in (owned_partition("alice", trip), f"5:alice:{trip}"):
            work.clear()
            assert (await store.history(forged, "mallory")).messages == []
            assert sum(work) == 0, (forged, sum(work))
            assert (await store.history(forged, "alice")).messages == []  # alice never wrote that id
    finally:
        await store.aclose()


async def test_dynamodb_history_of_a_name_too_long_for_its_partition_key_is_its_legacy_messages(
    dynalite_endpoint: str,
) -> None:
    """A user named before names were bounded (edge/keys/record.py MAX_USER_BYTES), or imported
    from a keys file: their conversation's partition (`<len>/<user>/<id>`) is past DynamoDB's 2,048
    bytes. Their messages were refused (MessageRefused), and the history's Query was refused too, a
    ValidationException AWS answers and dynalite does not (its key size is checked on writes and
    GetItem only: the rule is added here, in front of the real client), which the route answered 503
    store_unavailable, for good. None can be in that partition; those written before partitions
    named their owner are still read."""
    store = dynamodb_store(dynalite_endpoint)
    await store.create_table_if_missing()
    _check_hash_key_size_as_aws_does(store)
    long_user = "u" * 3000
    conv = conversation()
    try:
        assert (await store.history(conv, long_user)).messages == []
        before = new_message(conv, long_user, "user", "asked before", "r_1")
        store._client.put_item(TableName=TABLE, Item=_legacy_item(before))
        assert (await store.history(conv, long_user)).messages == [before]
    finally:
        await store.aclose()


def _check_hash_key_size_as_aws_does(store: DynamoDBMessageStore) -> None:
    """AWS refuses a Query whose partition key is past 2,048 bytes (a ValidationException);
    dynalite checks a key's size on writes and GetItem only: the rule is added in front of the real
    client."""

    def as_aws_checks(params: dict[str, Any], **_: Any) -> None:
        partition = params["ExpressionAttributeValues"][":c"]["S"]
        if len(partition.encode()) > 2048:
            error = {"Code": "ValidationException", "Message": "Size of hashkey has exceeded 2048 bytes"}
            raise ClientError({"Error": error}, "Query")

    store._client.meta.events.register("before-parameter-build.dynamodb.Query", as_aws_checks)


async def test_dynamodb_history_of_a_conversation_id_too_long_for_any_partition_is_empty(
    dynalite_endpoint: str,
) -> None:
    """GET /v1/conversations/{id}/messages takes any id in its path: one past DynamoDB's 2,048 bytes
    can hold no message (a chat request's conversation_id is 256 characters at most), yet the legacy
    read (the client's id alone as the partition) sent it as a Query's key, which AWS refuses with a
    ValidationException: the route's 503 store_unavailable, for good, where SQLite's store answers
    an empty history (the route's 404)."""
    store = dynamodb_store(dynalite_endpoint)
    await store.create_table_if_missing()
    _check_hash_key_size_as_aws_does(store)
    try:
        assert (await store.history("c" * 3000, "alice")).messages == []
        assert (await store.history("\u00e9" * 1100, "alice")).messages == []
    finally:
        await store.aclose()


async def test_a_messages_participant_name_round_trips(store: MessageStore) -> None:
    """A multi-participant chat's turns say who spoke (OpenAI's `name`): reloaded without it, the
    history replays every user's turn as one speaker's."""
    conv = conversation()
    named = new_message(conv, "alice", "user", "I'll take the north route", "r_1", name="bob_2")
    unnamed = new_message(conv, "alice", "assistant", "Noted.", "r_1", finish_reason="stop")
    await store.append(named)
    await store.append(unnamed)

    assert [(m.name, m.content) for m in (await store.history(conv, "alice")).messages] == [
        ("bob_2", "I'll take the north route"),
        (None, "Noted."),
    ]


async def test_sqlite_adds_the_name_column_to_a_file_written_before_it(tmp_path: Path) -> None:
    """A file of the release before has no `name` column: it opens, keeps its messages, and takes
    named ones."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        """CREATE TABLE messages (conversation_id TEXT NOT NULL, message_id TEXT NOT NULL,
        user TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, request_id TEXT NOT NULL,
        created_at REAL NOT NULL, finish_reason TEXT, PRIMARY KEY (conversation_id, message_id))
        WITHOUT ROWID;"""
    )
    old.execute(
        "INSERT INTO messages VALUES (?,?,?,?,?,?,?,?)",
        ("c", "01J0000000000000000000000A", "alice", "user", "before", "r_0", time.time(), None),
    )
    old.commit()
    old.close()
    store = SQLiteMessageStore(path)
    try:
        await store.append(new_message("c", "alice", "user", "after", "r_1", name="carol"))
        again = SQLiteMessageStore(path)  # a second worker opening the file migrated by the first
        await again.aclose()
        assert [(m.content, m.name) for m in (await store.history("c", "alice")).messages] == [
            ("before", None),
            ("after", "carol"),
        ]
    finally:
        await store.aclose()


async def test_a_replys_model_round_trips(store: MessageStore) -> None:
    """A conversation may move from model to model: its turns kept no model, and a history read
    back could not tell which model said what."""
    conv = conversation()
    await store.append(new_message(conv, "alice", "user", "Hi", "r_1"))
    await store.append(new_message(conv, "alice", "assistant", "Hello.", "r_1", "stop", model="small"))
    await store.append(new_message(conv, "alice", "assistant", "Hello!", "r_2", "stop", model="large"))
    assert [(m.role, m.model) for m in (await store.history(conv, "alice")).messages] == [
        ("user", None),
        ("assistant", "small"),
        ("assistant", "large"),
    ]


async def test_sqlite_adds_the_model_column_to_a_file_written_before_it(tmp_path: Path) -> None:
    """A file of the release before has no `model` column: it opens (a second worker too), keeps
    its messages, read without a model, and takes replies with one."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        """CREATE TABLE messages (conversation_id TEXT NOT NULL, message_id TEXT NOT NULL,
        user TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, request_id TEXT NOT NULL,
        created_at REAL NOT NULL, finish_reason TEXT, name TEXT, PRIMARY KEY (conversation_id, message_id))
        WITHOUT ROWID;"""
    )
    old.execute(
        "INSERT INTO messages VALUES (?,?,?,?,?,?,?,?,?)",
        ("c", "01J0000000000000000000000A", "alice", "assistant", "before", "r_0", time.time(), "stop", None),
    )
    old.commit()
    old.close()
    store = SQLiteMessageStore(path)
    try:
        await store.append(new_message("c", "alice", "assistant", "after", "r_1", "stop", model="small"))
        again = SQLiteMessageStore(path)
        await again.aclose()
        assert [(m.content, m.model) for m in (await store.history("c", "alice")).messages] == [
            ("before", None),
            ("after", "small"),
        ]
    finally:
        await store.aclose()


async def test_a_dynamodb_item_written_before_replies_kept_their_model_reads_without_one(
    dynalite_endpoint: str,
) -> None:
    conv = conversation()
    store = dynamodb_store(dynalite_endpoint)
    await store.create_table_if_missing()
    try:
        reply = new_message(conv, "alice", "assistant", "before", "r_0", "stop")
        item = {
            "conversation_id": {"S": owned_partition("alice", conv)},
            "conversation": {"S": conv},
            "message_id": {"S": reply.message_id},
            "owner": {"S": "alice"},
            "role": {"S": "assistant"},
            "content": {"S": "before"},
            "request_id": {"S": "r_0"},
            "created_at": {"N": repr(reply.created_at)},
            "expires_at": {"N": str(int(reply.created_at) + 3600)},
            "finish_reason": {"S": "stop"},
        }
        store._client.put_item(TableName=TABLE, Item=item)  # as the release before wrote it
        await store.append(new_message(conv, "alice", "assistant", "after", "r_1", "stop", model="large"))
        assert [(m.content, m.model) for m in (await store.history(conv, "alice")).messages] == [
            ("before", None),
            ("after", "large"),
        ]
    finally:
        await store.aclose()
