"""Named conversations are stored off the hot path; a replica dying mid-stream ends the stream; a
client hanging up as soon as its stream starts leaves nothing running. On either upstream path,
where the test takes `server` (see tests/edge/conftest.py)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gpu_container.engine.front import EngineFront
from tests.edge.conftest import (
    BOTH_PATHS,
    ROOMY_TIERS,
    finished_requests,
    idle_engine,
    wait_for_engine,
    wait_for_engine_to_drop,
)
from tests.edge.sse_client import CHAT, DONE, KEEPALIVE, LONG_PROMPT, MODEL, content_of, events, wait_until
from tests.support.live_server import LiveServer, start_server

UPSTREAMS = BOTH_PATHS


def test_a_named_conversation_is_stored_for_its_owner_only(server: LiveServer, client: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "remember me"}],
        "max_tokens": 6,
        "stream": True,
        "conversation_id": "conv-edge-1",
    }
    with client.stream("POST", CHAT, json=body, headers=server.auth("free")) as response:
        reply = content_of(list(events(response)))
        rid = response.headers["x-request-id"]
    url = "/v1/conversations/conv-edge-1/messages"

    def stored() -> bool:
        answer = client.get(url, headers=server.auth("free"))
        return answer.status_code == 200 and len(answer.json()["data"]) == 2

    wait_until(stored, what="the message writer to store the turn")
    data = client.get(url, headers=server.auth("free")).json()["data"]
    assert [(m["role"], m["content"]) for m in data] == [("user", "remember me"), ("assistant", reply)]
    assert {m["request_id"] for m in data} == {rid}
    assert client.get(url, headers=server.auth("free2")).status_code == 404


def test_a_continued_reply_is_stored_whole_after_its_question_and_a_system_prompt_alone_asks_nothing(
    server: LiveServer, client: httpx.Client
) -> None:
    """A request ending on an assistant's message continues it (continue_final_message): the
    history gains the whole continued reply, not the continuation's end alone, after the question
    that led to it, as any turn is stored (the edge cannot tell a beginning the client wrote from a
    reply it stored: left out, a prefill's question was lost). A system prompt alone asks
    nothing."""
    url = "/v1/conversations/conv-edge-continue/messages"

    def history() -> list[tuple[str, str]]:
        data = client.get(url, headers=server.auth("paid")).json().get("data", [])
        return [(m["role"], m["content"]) for m in data]

    ask = {"model": MODEL, "max_tokens": 4, "temperature": 0, "conversation_id": "conv-edge-continue"}
    first = client.post(
        CHAT, json=ask | {"messages": [{"role": "user", "content": "Q1"}]}, headers=server.auth("paid")
    )
    answer = first.json()["choices"][0]["message"]["content"]
    wait_until(lambda: len(history()) == 2, what="the first turn stored")
    began = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "The"}]
    flags = {"continue_final_message": True, "add_generation_prompt": False}
    more = client.post(CHAT, json=ask | flags | {"messages": began}, headers=server.auth("paid"))
    assert more.status_code == 200, more.text
    continuation = more.json()["choices"][0]["message"]["content"]
    wait_until(lambda: len(history()) >= 4, what="the continued turn stored")
    system_only = [{"role": "system", "content": "Say hello."}]
    alone = client.post(CHAT, json=ask | {"messages": system_only}, headers=server.auth("paid"))
    assert alone.status_code == 200, alone.text
    wait_until(lambda: len(history()) >= 5, what="the system prompt's reply stored")
    assert history() == [
        ("user", "Q1"),
        ("assistant", answer),
        ("user", "Q1"),
        ("assistant", "The" + continuation),
        ("assistant", alone.json()["choices"][0]["message"]["content"]),
    ]


def test_every_user_message_of_a_turn_is_stored_in_order(server: LiveServer, client: httpx.Client) -> None:
    """A turn may hold several user messages after the assistant's last reply (a question sent in
    two parts, two participants of a group chat speaking before the assistant answers): the model
    read them all, and the history kept the last alone, losing what the user said first."""
    for stream in (False, True):
        conv = f"conv-edge-two-users-{stream}"
        messages = [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "I am going to Lima.", "name": "alice"},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What should I pack?", "name": "bob"},
        ]
        body = {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": stream}
        body["conversation_id"] = conv
        if stream:
            with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
                reply = content_of(list(events(response)))
        else:
            answer = client.post(CHAT, json=body, headers=server.auth("paid"))
            assert answer.status_code == 200, answer.text
            reply = answer.json()["choices"][0]["message"]["content"]
        data = client.get(f"/v1/conversations/{conv}/messages", headers=server.auth("paid")).json()["data"]
        assert [(m["role"], m["name"], m["content"]) for m in data] == [
            ("user", "alice", "I am going to Lima."),
            ("user", "bob", "What should I pack?"),
            ("assistant", None, reply),
        ]


def test_a_reply_begun_by_the_client_is_stored_after_its_question(
    server: LiveServer, client: httpx.Client
) -> None:
    """An assistant's beginning the client wrote (continue_final_message: a prefill, "```json"):
    the question that led to it is the turn's user message, and the reply was stored alone, the
    question lost; read back, the conversation was an answer to nothing."""
    for stream in (False, True):
        conv = f"conv-edge-prefill-{stream}"
        body = {
            "model": MODEL,
            "max_tokens": 4,
            "temperature": 0,
            "stream": stream,
            "conversation_id": conv,
            "continue_final_message": True,
            "add_generation_prompt": False,
            "messages": [
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "The"},
            ],
        }
        if stream:
            with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
                continuation = content_of(list(events(response)))
        else:
            answer = client.post(CHAT, json=body, headers=server.auth("paid"))
            assert answer.status_code == 200, answer.text
            continuation = answer.json()["choices"][0]["message"]["content"]
        data = client.get(f"/v1/conversations/{conv}/messages", headers=server.auth("paid")).json()["data"]
        assert [(m["role"], m["content"]) for m in data] == [
            ("user", "Name a colour."),
            ("assistant", "The" + continuation),
        ]


def test_a_question_followed_by_instructions_is_stored_with_its_reply(
    server: LiveServer, client: httpx.Client
) -> None:
    """Apps put instructions after the user's message (a developer reminder, retrieved context as
    a system message): the request still asks the user's question, and its turn was stored as the
    reply alone, the question lost from the history."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is Lima?"},
        {"role": "developer", "content": "Answer in French."},
        {"role": "system", "content": "Context: Lima is in Peru."},
    ]
    for stream in (False, True):
        conv = f"conv-edge-instructed-{stream}"
        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 4,
            "stream": stream,
            "conversation_id": conv,
        }
        if stream:
            with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
                reply = content_of(list(events(response)))
        else:
            answer = client.post(CHAT, json=body, headers=server.auth("paid"))
            reply = answer.json()["choices"][0]["message"]["content"]
        # Read as the reply ends: the edge that answered waits for its own turns (README).
        data = client.get(f"/v1/conversations/{conv}/messages", headers=server.auth("paid")).json()["data"]
        assert [(m["role"], m["content"]) for m in data] == [("user", "Where is Lima?"), ("assistant", reply)]


def test_the_prompt_is_stored_before_the_reply_ends_and_a_cancelled_reply_is_kept(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    # The messages stay long_body's own: its seed is the one that runs to full length with them
    # (with other messages the reply may end on its own before the cancel lands).
    body = long_body | {"conversation_id": "conv-edge-partial"}
    url = "/v1/conversations/conv-edge-partial/messages"

    def history(who: str) -> list[tuple[str, str | None]]:
        answer = client.get(url, headers=server.auth(who))
        return [(m["role"], m["finish_reason"]) for m in answer.json()["data"]] if answer.is_success else []

    with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
        stream = events(response)
        # Cancelled from the first event on: on Triton the replica's stream may still be setting up.
        rid = next(stream)["request_id"]
        # Stored while the reply is still streaming: an edge dying now keeps the user's message.
        wait_until(lambda: history("paid") == [("user", None)], what="the prompt to be stored")
        assert client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid")).status_code == 200
        reply = content_of(list(stream))

    wait_until(lambda: len(history("paid")) == 2, what="the partial reply to be stored")
    data = client.get(url, headers=server.auth("paid")).json()["data"]
    assert [(m["role"], m["content"], m["finish_reason"]) for m in data] == [
        ("user", long_body["messages"][-1]["content"], None),
        ("assistant", reply, "cancelled"),
    ]
    assert client.get(url, headers=server.auth("free")).status_code == 404


def test_replica_failure_mid_stream_ends_with_an_error_event(
    tmp_path: Path, long_body: dict[str, Any]
) -> None:
    body = long_body
    with start_server(tmp_path) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
            stream = events(response)
            next(stream)
            assert next(stream)["choices"][0]["delta"]["content"] is not None
            upstream = server.app.state.runtime.upstreams[0]
            assert isinstance(upstream, EngineFront)
            upstream.stop()  # the replica goes away with the sequence running
            rest = list(stream)
    assert rest[-1] == DONE
    error = rest[-2]["error"]
    assert error["code"] == "upstream_error" and error["type"] == "api_error"
    assert not any(isinstance(e, dict) and e.get("choices", [{}])[0].get("finish_reason") for e in rest[:-2])


def _chat_on_a_socket(server: LiveServer, body: dict[str, Any]) -> socket.socket:
    """A chat request sent on a socket of its own, for the test to read from and to hang up on."""
    payload = httpx.Request("POST", server.base_url + CHAT, json=body).read()
    host, port = "127.0.0.1", int(server.base_url.rsplit(":", 1)[1])
    sock = socket.create_connection((host, port), timeout=30)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {server.keys['paid']}\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def test_a_client_hanging_up_right_after_the_first_event_frees_the_replica(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    """The first event (the role) goes out before any token, so the hang-up may land while the
    replica's stream is still being set up: the edge must count a disconnect and drop the sequence."""
    disconnected = finished_requests(server, "disconnected")
    before = idle_engine(server)
    with _chat_on_a_socket(server, long_body) as sock:
        received = b""
        while b"data: {" not in received:
            data = sock.recv(65536)
            assert data, "the server closed the stream before its first event"
            received += data
    wait_until(
        lambda: finished_requests(server, "disconnected") == disconnected + 1,
        what="the edge to see the disconnect",
    )
    # A short request run to its end after the hang-up, so the replica's reading below is one taken
    # since (not a gauge from before the long request started).
    short = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 2}
    assert client.post(CHAT, json=short, headers=server.auth("paid")).status_code == 200
    after = wait_for_engine_to_drop(server, before)
    assert after.work - before.work < long_body["max_tokens"]


def test_a_request_turned_away_while_queued_leaves_no_question_in_the_history(
    tmp_path: Path, long_body: dict[str, Any]
) -> None:
    """Cancelled (or refused) in the queue, a request gets no answer: its question must not be
    stored, or the client's retry leaves it twice in the history."""
    overrides = {"engine": {"max_num_seqs": 1}, "server": {"keepalive_s": 0.02}, "tiers": ROOMY_TIERS}
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "still there?"}],
        "max_tokens": 2,
        "stream": True,
        "conversation_id": "conv-queued",
    }
    url = "/v1/conversations/conv-queued/messages"
    with (
        start_server(tmp_path, overrides) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        paid = server.auth("paid")
        with client.stream("POST", CHAT, json=long_body, headers=paid) as first:
            holding = events(first)
            first_id = next(holding)["request_id"]
            next(holding)  # it holds the only sequence now
            with client.stream("POST", CHAT, json=ask, headers=paid) as queued:
                waiting = events(queued)
                queued_id = next(waiting)["request_id"]
                assert next(waiting) == KEEPALIVE
                assert client.post(f"{CHAT}/{queued_id}/cancel", headers=paid).status_code == 200
                assert [e for e in waiting if e != KEEPALIVE][-1] == DONE
            assert client.post(f"{CHAT}/{first_id}/cancel", headers=paid).status_code == 200
            list(holding)
        with client.stream("POST", CHAT, json=ask, headers=paid) as retried:
            reply = content_of(list(events(retried)))
            retried_id = retried.headers["x-request-id"]

        def answered() -> bool:
            data = client.get(url, headers=paid).json().get("data", [])
            return bool(data) and data[-1]["role"] == "assistant"

        wait_until(answered, what="the retried turn to be stored")
        data = client.get(url, headers=paid).json()["data"]
    assert [(m["role"], m["content"], m["request_id"]) for m in data] == [
        ("user", "still there?", retried_id),
        ("assistant", reply, retried_id),
    ]


def test_a_conversation_id_is_one_the_history_can_be_read_back_by(
    server: LiveServer, client: httpx.Client
) -> None:
    """The history's URL holds the id as one path segment: an id it could never name (empty, or
    with a '/') is refused up front, while any other, escaped, reads back."""
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for unreadable in ("", "team/42"):
        refused = client.post(CHAT, json=ask | {"conversation_id": unreadable}, headers=server.auth("paid"))
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "conversation_id"
    odd = "what? x#1 é"
    served = client.post(CHAT, json=ask | {"conversation_id": odd}, headers=server.auth("paid"))
    assert served.status_code == 200
    url = f"/v1/conversations/{quote(odd, safe='')}/messages"
    wait_until(
        lambda: len(client.get(url, headers=server.auth("paid")).json().get("data", [])) == 2,
        what="the turn to be stored",
    )


def _stored_turns(client: httpx.Client, server: LiveServer, cid: str) -> list[tuple[str, str]]:
    answer = client.get(f"/v1/conversations/{cid}/messages", headers=server.auth("paid"))
    return [(m["role"], m["content"]) for m in answer.json()["data"]] if answer.is_success else []


def _after_a_marker(client: httpx.Client, server: LiveServer, name: str) -> None:
    """A request whose turns are stored after whatever an earlier request stored (one writer, in
    order): once they are, an earlier request's turns would be too."""
    marker = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answer = client.post(CHAT, json=marker | {"conversation_id": name}, headers=server.auth("paid"))
    assert answer.status_code == 200, answer.text
    wait_until(lambda: len(_stored_turns(client, server, name)) == 2, what="the marker's turns to be stored")


def test_an_answer_not_streamed_the_client_hung_up_on_stores_no_turn(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    """Not streamed, a client that hangs up (an SDK's read timeout, which it retries) got nothing:
    its question and the reply it never saw were stored, the question twice once retried (a
    review), as a 502's were before."""
    cid = "conv-hung-up"
    before = idle_engine(server)
    with _chat_on_a_socket(server, long_body | {"stream": False, "conversation_id": cid}):
        wait_for_engine(server, lambda r: r.work > before.work, "the reply to be under way")
    wait_for_engine_to_drop(server, before)
    _after_a_marker(client, server, "conv-hung-up-marker")
    assert _stored_turns(client, server, cid) == []


def test_continuing_a_users_message_stores_the_continuation_alone_as_the_reply(
    server: LiveServer, client: httpx.Client
) -> None:
    """continue_final_message on a final user message (the template leaves it open): the question is
    the user's turn, and the assistant's turn was stored as the user's text again followed by the
    continuation (a review); only a continued assistant message is the reply's own beginning."""
    cid = "conv-continue-user"
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "temperature": 0,
        "conversation_id": cid,
        "continue_final_message": True,
        "add_generation_prompt": False,
        "messages": [{"role": "user", "content": "Tell me about"}],
    }
    answer = client.post(CHAT, json=body, headers=server.auth("paid"))
    assert answer.status_code == 200, answer.text
    continuation = answer.json()["choices"][0]["message"]["content"]
    wait_until(lambda: len(_stored_turns(client, server, cid)) == 2, what="the turns to be stored")
    assert _stored_turns(client, server, cid) == [("user", "Tell me about"), ("assistant", continuation)]


def test_a_reply_cut_by_the_token_budget_is_stored_as_cut_by_it(tmp_path: Path) -> None:
    """The client is told its reply stopped because its token budget ran out (`"floodgate":
    {"limit_reached": "tokens"}`, the playground's "budget used up"); the history said `length`
    alone, as for a reply that reached its max_tokens: reloaded, the cut looked like the reply's
    own end. A cancelled reply was told apart (`cancelled`); this one now is too."""
    tiers = {"paid": {"tokens_per_window": 60}}  # "hi" and its template: about 20 tokens
    with start_server(tmp_path, {"tiers": tiers}) as server, httpx.Client(base_url=server.base_url) as client:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100,
            # The budget leaves ~40 tokens for the reply; a sampled reply that ended by itself
            # within them (a fresh-clone CI run's did, at the budget's last token) was no cut.
            "ignore_eos": True,
            "stream": True,
            "conversation_id": "conv-budget-ends",
        }
        with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
            chunks = [e for e in events(response) if e != DONE]
        assert chunks[-1]["floodgate"] == {"limit_reached": "tokens"}
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        url = "/v1/conversations/conv-budget-ends/messages"
        data = client.get(url, headers=server.auth("paid")).json()["data"]
    assert [(m["role"], m["content"], m["finish_reason"]) for m in data] == [
        ("user", "hi", None),
        ("assistant", content_of(chunks), "limit_reached"),
    ]
