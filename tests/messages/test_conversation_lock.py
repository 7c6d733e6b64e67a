"""One request at a time per conversation (edge/messages/conversation_lock.py), on SQLite and on
DynamoDB (dynalite) alike: in the store, and on a real edge, where a second streamed request on a
conversation in use was admitted and the two stored their turns interleaved (question 1,
question 2, reply 1, reply 2)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from edge.messages import sqlite as messages_sqlite
from edge.messages.conversation_lock import (
    LOCK_THREADS,
    ConversationLocked,
    ConversationLocks,
    LockStore,
    Taken,
)
from edge.messages.message import new_message
from edge.messages.store import MessageStore
from tests.edge.conftest import ROOMY_TIERS, finished_requests
from tests.edge.sse_client import CHAT, DONE, MODEL, content_of, events, wait_until
from tests.support.held_engines import engines_held
from tests.support.live_server import LiveServer, start_server

LOCKED = {
    "error": {
        "message": "Another process is currently operating on this conversation. "
        "Please retry in a few seconds.",
        "type": "invalid_request_error",
        "param": "conversation_id",
        "code": "conversation_locked",
    }
}


def conversation() -> str:
    return f"c_{uuid.uuid4().hex}"


@pytest.mark.anyio
async def test_a_conversation_is_held_by_one_request_of_its_user_until_that_one_gives_it_back(
    store: MessageStore,
) -> None:
    locks = cast(LockStore, store)
    conv, now = conversation(), time.time()
    assert locks.take_lock("alice", conv, "r_1", now, now + 20)
    assert not locks.take_lock("alice", conv, "r_2", now, now + 20)
    # Conversation ids are the user's own: another user's of the same name is another conversation.
    assert locks.take_lock("bob", conv, "r_3", now, now + 20)
    # Only its holder gives it back, or renews it.
    locks.release_lock("alice", conv, "r_2", now + 1, None)
    assert not locks.renew_lock("alice", conv, "r_2", now + 40)
    assert not locks.take_lock("alice", conv, "r_2", now, now + 20)
    locks.release_lock("alice", conv, "r_1", now + 1, None)
    assert locks.take_lock("alice", conv, "r_2", now, now + 20)
    # The lock is no message: the history holds the turns alone.
    turn = new_message(conv, "alice", "user", "hello", "r_2")
    await store.append(turn)
    assert (await store.history(conv, "alice")).messages == [turn]


@pytest.mark.anyio
async def test_a_released_lock_gives_the_next_taker_the_conversations_newest_message_id(
    store: MessageStore,
) -> None:
    """Kept a moment with no holder, it is taken at once, and tells the next request, on whatever
    edge, which id its turns must sort after (edge/messages/ids.py)."""
    locks = cast(LockStore, store)
    conv, now = conversation(), time.time()
    first = locks.take_lock("alice", conv, "r_1", now, now + 20)
    assert first is not None and first.last_message_id is None
    locks.release_lock("alice", conv, "r_1", now + 1, "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    second = locks.take_lock("alice", conv, "r_2", now, now + 20)
    assert second is not None and second.last_message_id == "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    # A release that made no turn (a take given back unused) leaves the newest as it was.
    locks.release_lock("alice", conv, "r_2", now + 1, None)
    third = locks.take_lock("alice", conv, "r_3", now, now + 20)
    assert third is not None and third.last_message_id == "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    assert not locks.renew_lock("alice", conv, "r_2", now + 40)


@pytest.mark.anyio
async def test_a_lock_expires_unless_renewed(store: MessageStore) -> None:
    """An edge that dies holding a lock blocks the conversation until it expires, not for good;
    a request that runs longer than the expiry keeps it, renewed."""
    clock = [time.time()]
    renewals: list[str] = []

    class Counted:
        """The store, its renewals counted: each is a write (a DynamoDB write unit)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def renew_lock(self, user: str, conversation_id: str, holder: str, expires_at: float) -> bool:
            renewals.append(holder)
            return cast(LockStore, store).renew_lock(user, conversation_id, holder, expires_at)

    locks = ConversationLocks(cast(LockStore, Counted()), ttl_s=20.0, clock=lambda: clock[0])
    conv = conversation()
    held = await locks.take("alice", conv, "r_1")
    assert held is not None
    clock[0] += 5
    await locks.renew()  # what the edge's renewal task does every few seconds
    assert renewals == []  # 15 s of 20 left: not due, and not written
    clock[0] += 10
    await locks.renew()
    assert renewals == ["r_1"]  # 5 s left: renewed, to 20 s from now
    clock[0] += 15  # past the first expiry, not the renewed one
    with pytest.raises(ConversationLocked):
        await locks.take("alice", conv, "r_2")
    # The edge died: nothing renews the lock any more, and it expires.
    clock[0] += 6
    taken = await locks.take("alice", conv, "r_3")
    assert taken is not None
    # The dead holder's release, had it come, would not free the new holder's lock.
    await held.release()
    with pytest.raises(ConversationLocked):
        await locks.take("alice", conv, "r_4")
    await taken.release()
    assert await locks.take("alice", conv, "r_4") is not None


@pytest.mark.anyio
async def test_a_burst_of_conversation_requests_on_a_store_that_answers_takes_every_lock(
    store: MessageStore,
) -> None:
    """More conversation requests at once than the locks have threads (a soak's 40 users sending
    at the same moment) found every thread busy with takes the store was answering in
    milliseconds, and went on unlocked: three requests on one conversation all ran, and its history
    read question, question, question, reply, reply, reply. A request waits for a thread, as it
    waits for its take, within TAKE_WAIT_S; only threads all held by calls the store has left
    unanswered past that wait (a silent store) send it on unlocked at once."""
    answer = threading.Event()
    in_store = threading.Semaphore(0)

    class Answering:
        """The store, its first LOCK_THREADS takes answered once the test says (milliseconds)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def take_lock(
            self, user: str, conversation_id: str, holder: str, now: float, expires_at: float
        ) -> Taken | None:
            if holder.startswith("first"):
                in_store.release()
                answer.wait(10)
            return cast(LockStore, store).take_lock(user, conversation_id, holder, now, expires_at)

    locks = ConversationLocks(cast(LockStore, Answering()))
    first = [
        asyncio.ensure_future(locks.take("alice", conversation(), f"first_{i}")) for i in range(LOCK_THREADS)
    ]
    for _ in first:  # every lock thread is in the store, being answered
        await asyncio.to_thread(in_store.acquire)
    conv = conversation()
    late = asyncio.ensure_future(locks.take("alice", conv, "r_late"))
    await asyncio.wait({late}, timeout=0.1)  # unlocked at once, before: done, and None
    answer.set()  # the store answers the first ones
    assert all(held is not None for held in await asyncio.gather(*first))
    assert await late is not None
    with pytest.raises(ConversationLocked):
        await locks.take("alice", conv, "r_again")


@pytest.fixture
def lock_server(
    store_endpoint: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveServer]:
    settings: dict[str, Any] = {"tiers": ROOMY_TIERS}
    if store_endpoint is not None:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, "test")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        table = f"floodgate-locks-{uuid.uuid4().hex[:8]}"
        settings["messages"] = {
            "backend": "dynamodb",
            "dynamodb_endpoint": store_endpoint,
            "dynamodb_table": table,
        }
    with start_server(tmp_path, settings) as server:
        yield server


def test_a_second_request_on_a_conversation_in_use_is_refused_until_the_first_ends(
    lock_server: LiveServer,
) -> None:
    server = lock_server
    conv = conversation()

    def ask(question: str, stream: bool = True) -> dict[str, Any]:
        messages = [{"role": "user", "content": question}]
        return {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 6,
            "stream": stream,
            "conversation_id": conv,
        }

    def history() -> list[tuple[str, str]]:
        url = f"/v1/conversations/{conv}/messages"
        answer = httpx.get(server.base_url + url, headers=server.auth("paid"), timeout=30)
        return [(m["role"], m["content"]) for m in answer.json()["data"]]

    with (
        httpx.Client(base_url=server.base_url, timeout=30) as first_client,
        httpx.Client(base_url=server.base_url, timeout=30) as second_client,
    ):
        # The engines held still: the first stream is admitted and cannot end while the second comes.
        with engines_held(server) as let_go:
            with first_client.stream("POST", CHAT, json=ask("first"), headers=server.auth("paid")) as first:
                stream = events(first)
                assert next(stream)["choices"][0]["delta"]["role"] == "assistant"  # admitted
                with second_client.stream(
                    "POST", CHAT, json=ask("second"), headers=server.auth("paid")
                ) as second:
                    # Another user's conversation of the same name is not this one.
                    other = second_client.stream("POST", CHAT, json=ask("mine"), headers=server.auth("free"))
                    with other as theirs:
                        assert theirs.status_code == 200
                    let_go()
                    reply = content_of(list(stream))
                    # Before, the second was admitted too: read to its end once the engines run.
                    second.read()
                # Before, the second's turns went between the first's: first, second, reply, reply.
                assert history() == [("user", "first"), ("assistant", reply)]
                assert (second.status_code, second.json()) == (400, LOCKED)
                assert "retry-after" not in second.headers  # OpenAI sends none
        # Its end gave the conversation back: the next question, streamed or not, is taken at once.
        with first_client.stream("POST", CHAT, json=ask("third"), headers=server.auth("paid")) as third:
            assert third.status_code == 200
            third_reply = content_of(list(events(third)))
        fourth = first_client.post(CHAT, json=ask("fourth", stream=False), headers=server.auth("paid"))
        assert fourth.status_code == 200, fourth.text
        assert history() == [
            ("user", "first"),
            ("assistant", reply),
            ("user", "third"),
            ("assistant", third_reply),
            ("user", "fourth"),
            ("assistant", fourth.json()["choices"][0]["message"]["content"]),
        ]

        # A client that hangs up mid-stream gives the conversation back too.
        before = finished_requests(server, "disconnected")
        with engines_held(server):
            with first_client.stream("POST", CHAT, json=ask("fifth"), headers=server.auth("paid")) as fifth:
                # Kept: a generator dropped closes its response (httpx), a hang-up too early.
                admitted = events(fifth)
                next(admitted)
                refused = second_client.post(
                    CHAT, json=ask("sixth", stream=False), headers=server.auth("paid")
                )
                assert refused.status_code == 400, refused.text
        wait_until(lambda: finished_requests(server, "disconnected") > before, 30, "the hang-up's end")
        with first_client.stream("POST", CHAT, json=ask("seventh"), headers=server.auth("paid")) as seventh:
            assert seventh.status_code == 200
            assert list(events(seventh))[-1] == DONE


def test_a_store_that_does_not_answer_holds_up_no_request_and_the_late_lock_is_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is the one store call before a conversation request's first token and at its end:
    a store that answered late (a DynamoDB connection gone silent, waited out by botocore's 5 s read
    timeout and retries; here the SQLite file's write lock held by another connection, its busy
    wait made long) held the request's first token, and its `[DONE]`, for as long. The request now
    goes on without the lock, and the take, landing once the store answers, is given back by its own
    thread: the conversation's next request is served, not refused for the lock's 30 s."""
    monkeypatch.setattr(messages_sqlite, "_BUSY_WAIT_MS", 600_000)
    conv = conversation()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}) as server:
        path = server.settings.messages.sqlite_path
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # another writer holds the file
            with (
                httpx.Client(base_url=server.base_url, timeout=60) as client,
                client.stream(
                    "POST", CHAT, json=body | {"conversation_id": conv}, headers=server.auth("paid")
                ) as held,
            ):
                assert held.status_code == 200
                assert list(events(held))[-1] == DONE
        finally:
            holder.execute("ROLLBACK")
            holder.close()

        def late_lock_given_back() -> bool:
            # Landed (its row written once the holder's ROLLBACK let it) and given back (no holder,
            # kept ORDER_KEPT_S for the next take's order): no rows at all reads the same before it
            # landed, and the next request then met it held.
            with contextlib.closing(sqlite3.connect(path)) as reader:
                rows = reader.execute("SELECT holder FROM conversation_locks").fetchall()
            return rows == [("",)]

        wait_until(late_lock_given_back, 30, "the late lock given back")
        again = httpx.post(
            server.base_url + CHAT,
            json=body | {"conversation_id": conv, "stream": False},
            headers=server.auth("paid"),
            timeout=60,
        )
        assert again.status_code == 200, again.text
