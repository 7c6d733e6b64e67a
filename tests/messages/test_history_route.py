"""GET /v1/conversations/{id}/messages on a real edge: a read right after a reply ends finds the
reply (the edge that served it waits for its own unwritten turns), pages walk a conversation of any
length as OpenAI's list endpoints page (on SQLite and on DynamoDB), and a bad parameter or an id no
URL can carry is a 400 naming it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.messages.message import StoredMessage, new_message
from edge.messages.sqlite import SQLiteMessageStore
from edge.messages.store import PAGE_CHARS, MessageStore
from tests.edge.sse_client import CHAT, DONE, MODEL, events, wait_until
from tests.messages.conftest import dynamodb_store
from tests.support.live_server import LiveServer, start_server

OWNER = "paid-user"  # the user of start_server's "paid" key


def _waiting_reads(server: LiveServer) -> float:
    for line in server.metrics_text().splitlines():
        if line.startswith("floodgate_history_reads_waiting "):
            return float(line.split()[1])
    return 0.0


def test_a_history_read_right_after_the_stream_ends_finds_the_reply(tmp_path: Path) -> None:
    """The store is held (another connection keeps SQLite's write lock) until the history read is
    at the edge: the turn is still in the edge's writer then, as under load, when the store lags
    the streams by a few hundred milliseconds. The read must wait for it, not answer without it."""
    messages = {"read_wait_s": 60.0}  # far past any wait here: the test decides when the store frees
    with (
        start_server(tmp_path, {"messages": messages}) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        held = sqlite3.connect(server.settings.messages.sqlite_path, isolation_level=None)
        held.execute("BEGIN IMMEDIATE")  # no other connection writes until it ends
        try:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "what did I ask?"}],
                "max_tokens": 8,
                "stream": True,
                "conversation_id": "read-after-done",
            }
            with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
                assert list(events(response))[-1] == DONE
            answer: list[httpx.Response] = []
            read = threading.Thread(
                target=lambda: answer.append(
                    client.get("/v1/conversations/read-after-done/messages", headers=server.auth("paid"))
                )
            )
            read.start()
            # Either the read waits at the edge, or (as before) it answered with what was stored.
            wait_until(lambda: bool(answer) or _waiting_reads(server) >= 1, 30, "the history read")
        finally:
            held.execute("ROLLBACK")
            held.close()
        read.join(60)
    assert answer[0].status_code == 200, answer[0].text
    assert [m["role"] for m in answer[0].json()["data"]] == ["user", "assistant"]


@pytest.fixture
def history_server(
    store_endpoint: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LiveServer, MessageStore]]:
    """An edge on SQLite or on DynamoDB (dynalite), and a store of its own on the same data, to
    write a long conversation faster than turns would."""
    if store_endpoint is None:
        with start_server(tmp_path) as server:
            store: MessageStore = SQLiteMessageStore(server.settings.messages.sqlite_path)
            yield server, store
        return
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    table = f"floodgate-history-{uuid.uuid4().hex[:8]}"
    messages = {"backend": "dynamodb", "dynamodb_endpoint": store_endpoint, "dynamodb_table": table}
    with start_server(tmp_path, {"messages": messages}) as server:
        yield server, dynamodb_store(store_endpoint, table)


def _write(store: MessageStore, messages: list[StoredMessage]) -> None:
    async def write_all() -> None:
        for start in range(0, len(messages), 50):
            await asyncio.gather(*(store.append(m) for m in messages[start : start + 50]))
        await store.aclose()

    asyncio.run(write_all())


def test_paging_reaches_every_message_of_a_long_conversation(
    history_server: tuple[LiveServer, MessageStore],
) -> None:
    """Past the largest page (1,000), the oldest turns were out of reach, and `after` was ignored:
    a client paging the OpenAI way got the same page forever."""
    server, store = history_server
    conv = f"long-{uuid.uuid4().hex[:8]}"
    mine = [
        new_message(conv, OWNER, ("user", "assistant")[i % 2], f"m{i}", f"r{i // 2}") for i in range(1003)
    ]
    # Another user's rows under the same id, among the owner's: the owner's pages skip them.
    noise = [new_message(conv, "free-user", "user", f"noise{i}", "rx") for i in range(40)]
    _write(store, mine[:500] + noise + mine[500:])
    ids = [m.message_id for m in mine]
    url = f"/v1/conversations/{conv}/messages"
    auth = server.auth("paid")

    def walk(**query: Any) -> list[dict[str, Any]]:
        pages, params = [], dict(query)
        for _ in range(len(ids) + 1):  # bounded: a cursor that is ignored must not loop forever
            page = httpx.get(server.base_url + url, params=params, headers=auth, timeout=30)
            assert page.status_code == 200, page.text
            pages.append(page.json())
            if not pages[-1]["has_more"]:
                break
            params["after"] = pages[-1]["last_id"]
        return pages

    forward = walk(limit=1000)
    assert [len(p["data"]) for p in forward] == [1000, 3]
    assert [m["id"] for p in forward for m in p["data"]] == ids
    first = forward[0]
    assert (first["object"], first["first_id"], first["last_id"]) == ("list", ids[0], ids[999])
    assert [m["content"] for m in first["data"][:2]] == ["m0", "m1"]

    backward = walk(limit=300, order="desc")
    assert [len(p["data"]) for p in backward] == [300, 300, 300, 103]
    assert [m["id"] for p in backward for m in p["data"]] == ids[::-1]

    # `before`: the page right before a cursor, in the list's order, as OpenAI's previous page.
    previous = httpx.get(server.base_url + url, params={"limit": 3, "before": ids[500]}, headers=auth).json()
    assert [m["id"] for m in previous["data"]] == ids[497:500] and previous["has_more"]
    between = {"after": ids[10], "before": ids[14], "limit": 10}
    assert [
        m["id"] for m in httpx.get(server.base_url + url, params=between, headers=auth).json()["data"]
    ] == ids[11:14]
    # Past the end of a conversation that exists: an empty page, not a 404.
    past = httpx.get(server.base_url + url, params={"after": ids[-1]}, headers=auth).json()
    assert (past["data"], past["has_more"], past["first_id"], past["last_id"]) == ([], False, None, None)
    # Someone else's conversation still looks missing, with a cursor too.
    stranger = httpx.get(server.base_url + url, params={"after": ids[0]}, headers=server.auth("free2"))
    assert stranger.status_code == 404


def test_a_page_of_long_messages_stops_at_its_text_budget_and_paging_goes_on(
    history_server: tuple[LiveServer, MessageStore],
) -> None:
    """A message is as long as a request body lets it be (1 MiB): a page of 1,000 such was a
    response of a gigabyte, built whole in the edge's memory (a read of 1,000 messages of 200 KB
    took the edge from 124 to 700 MB), for any user to ask again and again. A page ends early once
    its messages' text reaches PAGE_CHARS, `has_more` set, and the cursors walk on."""
    server, store = history_server
    conv = f"wide-{uuid.uuid4().hex[:8]}"
    size = PAGE_CHARS // 3 + 1  # three to a page would pass the budget: two fit
    mine = [new_message(conv, OWNER, "user", f"{i}".ljust(size, "x"), f"r{i}") for i in range(7)]
    _write(store, mine)
    ids = [m.message_id for m in mine]
    url = server.base_url + f"/v1/conversations/{conv}/messages"
    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        seen: list[str] = []
        params: dict[str, Any] = {"limit": 1000, "order": order}
        for _ in range(len(ids) + 1):
            page = httpx.get(url, params=params, headers=server.auth("paid"), timeout=60)
            assert page.status_code == 200, page.text
            body = page.json()
            assert sum(len(m["content"]) for m in body["data"]) <= PAGE_CHARS
            seen += [m["id"] for m in body["data"]]
            if not body["has_more"]:
                break
            params["after"] = body["last_id"]
        assert seen == expected
    # The previous page ends at its budget too, counted from its cursor back.
    previous = httpx.get(url, params={"before": ids[-1]}, headers=server.auth("paid"), timeout=60).json()
    assert [m["id"] for m in previous["data"]] == ids[-3:-1] and previous["has_more"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One edge for the tests below: each reads or writes a conversation of its own (or none), and
    the paid tier's budgets are far above their few dozen requests."""
    with start_server(tmp_path_factory.mktemp("edge")) as live:
        yield live


@pytest.mark.parametrize(
    ("query", "param", "says"),
    [
        ("limit=0", "limit", "Expected a value >= 1, but got 0"),
        ("limit=1001", "limit", "Expected a value <= 1000, but got 1001"),
        ("limit=abc", "limit", "expected an integer"),
        ("order=newest", "order", "Supported values are: 'asc' and 'desc'"),
        ("after=last", "after", "not a message id"),
        ("before=01J", "before", "not a message id"),
    ],
)
def test_a_bad_paging_parameter_is_a_400_naming_it(
    server: LiveServer, query: str, param: str, says: str
) -> None:
    answer = httpx.get(
        f"{server.base_url}/v1/conversations/any/messages?{query}", headers=server.auth("paid")
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and says in error["message"] and f"'{param}'" in error["message"]


@pytest.mark.parametrize("conversation_id", [".", ".."])
def test_a_conversation_id_no_url_can_carry_is_refused(server: LiveServer, conversation_id: str) -> None:
    """httpx and browsers resolve /v1/conversations/./messages before sending it: a conversation
    stored under "." or ".." could never be read back."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "conversation_id": conversation_id,
    }
    answer = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "conversation_id"


def test_a_participants_name_is_stored_and_the_history_replays_as_the_request_did(server: LiveServer) -> None:
    """A multi-participant chat names who said each turn (OpenAI's `name`): the stored turn lost it,
    and a client replaying its history replayed every participant as one. The stored turns, sent
    back as messages, make the prompt the original request made (its content parts as one text)."""
    conv = f"named-{uuid.uuid4().hex[:8]}"
    asked = {
        "role": "user",
        "name": "bob_2",
        "content": [{"type": "text", "text": "Where"}, {"type": "text", "text": "is Lima?"}],
    }
    ask = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    auth = server.auth("paid")
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        first = client.post(CHAT, json=ask | {"messages": [asked], "conversation_id": conv}, headers=auth)
        assert first.status_code == 200, first.text
        history = client.get(f"/v1/conversations/{conv}/messages", headers=auth)
        assert history.status_code == 200, history.text
        data = history.json()["data"]
        assert [(m["role"], m["name"]) for m in data] == [("user", "bob_2"), ("assistant", None)]
        replayed = [{k: data[0][k] for k in ("role", "name", "content")}]
        again = client.post(CHAT, json=ask | {"messages": replayed}, headers=auth)
    assert again.status_code == 200, again.text
    assert again.json()["usage"]["prompt_tokens"] == first.json()["usage"]["prompt_tokens"]
    assert data[0]["content"] == "Where\nis Lima?"


def test_history_reads_are_limited_apart_from_the_chat_completions(tmp_path: Path) -> None:
    """A loop reading a history was a store read each, without limit. The reads have a budget of
    their own, answered as the chat route's limits are (429, Retry-After, x-ratelimit-*), and
    spending it leaves the user's chat completions as they were."""
    reads = {"history_reads_per_window": 2, "history_read_window_s": 3600}
    with (
        start_server(tmp_path, {"tiers": {"paid": reads}}) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        auth = server.auth("paid")
        ask = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        first = client.post(CHAT, json=ask | {"conversation_id": "limited"}, headers=auth)
        assert first.status_code == 200, first.text
        url = "/v1/conversations/limited/messages"
        answers = [client.get(url, headers=auth) for _ in range(3)]
        other = client.get(url, headers=server.auth("free"))  # another user: its own budget (a 404)
        second = client.post(CHAT, json=ask, headers=auth)
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["1", "0", "0"]
    refused = answers[2]
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert 1 <= int(refused.headers["retry-after"]) <= 1800
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert other.status_code == 404
    assert second.status_code == 200, second.text
    chat_left = int(first.headers["x-ratelimit-remaining-requests"])
    assert int(second.headers["x-ratelimit-remaining-requests"]) == chat_left - 1


def test_an_assistants_refusal_replayed_is_read_as_its_turn(server: LiveServer) -> None:
    """OpenAI answers a refusal as `{"content": null, "refusal": "..."}`, and a client replays its
    history as it got it: the refusal was dropped, the model read an empty turn of its own, as if it
    had said nothing (a refusal content part was read)."""
    said = "I can't help with that."
    ask = {"model": MODEL, "max_tokens": 1, "temperature": 0}

    def prompt_tokens(assistant: dict[str, Any]) -> int:
        messages = [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", **assistant},
            {"role": "user", "content": "Q2"},
        ]
        answer = httpx.post(
            server.base_url + CHAT, json=ask | {"messages": messages}, headers=server.auth("paid"), timeout=30
        )
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["prompt_tokens"])

    as_text = prompt_tokens({"content": said})
    assert prompt_tokens({"content": None, "refusal": said}) == as_text
    assert prompt_tokens({"content": [{"type": "refusal", "refusal": said}]}) == as_text


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=1&limit=100", "limit"),
        ("order=asc&order=desc", "order"),
        ("after=01J00000000000000000000000&after=01J00000000000000000000001", "after"),
        ("before=01J00000000000000000000000&before=01J00000000000000000000001", "before"),
    ],
)
def test_a_paging_parameter_given_twice_is_a_400_naming_it(
    server: LiveServer, query: str, param: str
) -> None:
    """As on the usage and key routes (3e4567e): a page was answered for one of the two values,
    silently (Litestar keeps one), a client asking for the oldest messages read the newest as
    them. Refused: 400, naming the parameter."""
    answer = httpx.get(
        f"{server.base_url}/v1/conversations/any/messages?{query}", headers=server.auth("paid")
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error")
    assert "more than once" in error["message"]


def test_the_404_for_an_unknown_conversation_echoes_its_id_cut(server: LiveServer) -> None:
    """The 404 echoed the id in the path whole, where every other message cuts what the user sent
    (cancel's 404 too, 1299a8c): an id of 10,000 characters came back whole in the error. It is cut
    at the longest id a conversation may have (256), so a real id is never cut."""
    auth = server.auth("paid")
    for sent, echoed in (("y" * 10_000, "y" * 256), ("z" * 256, "z" * 256), ("unknown", "unknown")):
        answer = httpx.get(f"{server.base_url}/v1/conversations/{sent}/messages", headers=auth, timeout=30)
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["message"]) == ("not_found", f"No conversation {echoed}.")
