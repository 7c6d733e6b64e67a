"""MessageWriter: never blocks the caller, drops (and counts) when full, retries transient failures."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from prometheus_client import REGISTRY

from edge.messages.message import new_message
from edge.messages.sqlite import SQLiteMessageStore
from edge.messages.writer import QUEUE_CHARS, MessageWriter
from tests.messages.stores import FlakyStore, GatedStore, RefusingStore

pytestmark = pytest.mark.anyio


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_full_queue_drops_and_counts_instead_of_waiting(tmp_path: Path) -> None:
    store = GatedStore(SQLiteMessageStore(tmp_path / "m.db"))
    writer = MessageWriter(store, queue_size=2)
    writer.start()
    msgs = [new_message("c1", "alice", "user", f"m{i}", "r") for i in range(5)]
    dropped_before = counter("floodgate_messages_dropped_total")

    assert writer.submit(msgs[0])
    with anyio.fail_after(5):
        await store.entered.wait()  # the worker holds msgs[0] inside the slow store
    accepted = [writer.submit(m) for m in msgs[1:]]

    assert accepted == [True, True, False, False]
    assert counter("floodgate_messages_dropped_total") - dropped_before == 2
    store.gate.set()
    await writer.aclose()
    assert (await store.history("c1", "alice")).messages == msgs[:3]
    await store.aclose()


async def test_a_queue_of_long_messages_drops_past_its_text_not_only_its_count(tmp_path: Path) -> None:
    """A message may be as long as a request body: while the store lagged, the queue's 10,000 kept
    gigabytes in the edge's memory. Past QUEUE_CHARS of text a message is dropped, as one past the
    count is; a short one still fits, and the text written frees its room."""
    store = GatedStore(SQLiteMessageStore(tmp_path / "m.db"))
    # Its close writes what was taken (75 MB here) however long that takes on a loaded machine.
    writer = MessageWriter(store, queue_size=100, drain_timeout_s=600)
    writer.start()
    long_text = "x" * (QUEUE_CHARS // 4 + 1)  # one string, shared: the test holds it once
    msgs = [new_message("c1", "alice", "user", long_text, f"r{i}") for i in range(4)]
    short = new_message("c1", "alice", "assistant", "short", "r")
    dropped_before = counter("floodgate_messages_dropped_total")
    written_before = counter("floodgate_messages_written_total")

    assert writer.submit(msgs[0])
    with anyio.fail_after(5):
        await store.entered.wait()  # the worker holds msgs[0] inside the slow store: it still counts
    accepted = [writer.submit(m) for m in [*msgs[1:], short]]

    assert accepted == [True, True, False, True]
    assert counter("floodgate_messages_dropped_total") - dropped_before == 1
    store.gate.set()
    await writer.aclose()
    assert counter("floodgate_messages_written_total") - written_before == 4
    await store.aclose()


async def test_transient_failures_are_retried_until_written(tmp_path: Path) -> None:
    store = FlakyStore(SQLiteMessageStore(tmp_path / "m.db"), failures=3)
    writer = MessageWriter(store, queue_size=10, base_backoff_s=0.001, max_backoff_s=0.01)
    retries_before = counter("floodgate_message_write_retries_total")
    writer.start()
    msg = new_message("c1", "alice", "assistant", "reply", "r", finish_reason="stop")

    assert writer.submit(msg)
    await writer.aclose()

    assert (await store.history("c1", "alice")).messages == [msg]
    assert store.attempts == 4
    assert counter("floodgate_message_write_retries_total") - retries_before == 3
    await store.aclose()


async def test_a_message_is_given_up_after_max_attempts(tmp_path: Path) -> None:
    store = FlakyStore(SQLiteMessageStore(tmp_path / "m.db"), failures=100)
    writer = MessageWriter(store, queue_size=10, max_attempts=3, base_backoff_s=0.001)
    failed_before = counter("floodgate_messages_failed_total")
    writer.start()
    writer.submit(new_message("c1", "alice", "user", "lost", "r"))
    following = new_message("c1", "alice", "user", "kept", "r")
    writer.submit(following)
    store.failures_left = 3  # only the first message's three attempts fail

    await writer.aclose()

    assert counter("floodgate_messages_failed_total") - failed_before == 1
    assert (await store.history("c1", "alice")).messages == [following]
    await store.aclose()


async def test_a_refused_message_is_given_up_at_once(tmp_path: Path) -> None:
    """No retry mends a message the store refuses, and the messages behind it must not wait out
    the backoff of every attempt."""
    store = RefusingStore(SQLiteMessageStore(tmp_path / "m.db"))
    writer = MessageWriter(store, queue_size=10, max_attempts=5, base_backoff_s=60.0)
    failed_before = counter("floodgate_messages_failed_total")
    retries_before = counter("floodgate_message_write_retries_total")
    writer.start()
    writer.submit(new_message("c1", "alice", "user", "refused", "r"))
    following = new_message("c1", "bob", "user", "kept", "r")
    writer.submit(following)

    await writer.aclose()

    assert counter("floodgate_messages_failed_total") - failed_before == 1
    assert counter("floodgate_message_write_retries_total") == retries_before
    assert (await store.history("c1", "bob")).messages == [following]
    await store.aclose()


async def test_close_drains_within_its_bound_and_counts_what_is_left(tmp_path: Path) -> None:
    store = GatedStore(SQLiteMessageStore(tmp_path / "m.db"))  # never opened: the drain must give up
    writer = MessageWriter(store, queue_size=10, drain_timeout_s=0.1)
    writer.start()
    for i in range(4):
        writer.submit(new_message("c1", "alice", "user", f"m{i}", "r"))
    with anyio.fail_after(5):
        await store.entered.wait()
    dropped_before = counter("floodgate_messages_dropped_total")

    with anyio.fail_after(5):
        await writer.aclose()

    assert counter("floodgate_messages_dropped_total") - dropped_before == 4
    assert not writer.submit(new_message("c1", "alice", "user", "late", "r"))
    await store.aclose()


async def _reads_wait(count: float) -> None:
    """A task started just now has run up to its first wait after one checkpoint (asyncio runs the
    ready tasks in order): a read that waits has counted itself by then."""
    await anyio.lowlevel.checkpoint()
    assert counter("floodgate_history_reads_waiting") == count


async def test_a_read_waits_for_its_own_conversations_queued_messages(tmp_path: Path) -> None:
    store = GatedStore(SQLiteMessageStore(tmp_path / "m.db"))
    writer = MessageWriter(store, queue_size=10)
    writer.start()
    reply = new_message("c1", "alice", "assistant", "the reply", "r", finish_reason="stop")
    writer.submit(reply)
    # Another conversation, or another user's under the same id, has nothing queued: no wait.
    with anyio.fail_after(5):
        assert await writer.written("c2", "alice", timeout_s=60)
        assert await writer.written("c1", "bob", timeout_s=60)
    waiting = counter("floodgate_history_reads_waiting")

    async with anyio.create_task_group() as tasks:
        read: list[bool] = []

        async def reader() -> None:
            read.append(await writer.written("c1", "alice", timeout_s=60))

        tasks.start_soon(reader)
        await _reads_wait(waiting + 1)
        assert not read  # the reply is not written yet
        store.gate.set()

    assert read == [True]
    assert (await store.history("c1", "alice")).messages == [reply]
    await writer.aclose()
    await store.aclose()


async def test_a_read_waits_no_longer_than_its_bound_nor_past_the_shutdown(tmp_path: Path) -> None:
    store = GatedStore(SQLiteMessageStore(tmp_path / "m.db"))  # never opened
    writer = MessageWriter(store, queue_size=10, drain_timeout_s=0.01)
    writer.start()
    writer.submit(new_message("c1", "alice", "user", "stuck", "r"))
    unwritten = counter("floodgate_history_reads_unwritten_total")

    with anyio.fail_after(5):
        assert not await writer.written("c1", "alice", timeout_s=0.01)
    assert counter("floodgate_history_reads_unwritten_total") - unwritten == 1

    waiting = counter("floodgate_history_reads_waiting")
    async with anyio.create_task_group() as tasks:
        read: list[bool] = []

        async def reader() -> None:
            read.append(await writer.written("c1", "alice", timeout_s=60))

        tasks.start_soon(reader)
        await _reads_wait(waiting + 1)
        with anyio.fail_after(5):
            await writer.aclose()  # nothing more will be written: the read goes on with what is there
    assert read == [True]
    await store.aclose()
