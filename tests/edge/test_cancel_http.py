"""Cancelling through the endpoint and by hanging up both stop the engine's work, on either upstream
path: the replica itself (the in-process engine, or the Triton model's metrics) is read to show the
sequence was dropped, every KV block is free, and it stopped short of its full length."""

from __future__ import annotations

import logging
import re
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from edge.http_protocol import MAX_PIPELINED
from tests.edge.conftest import (
    BOTH_PATHS,
    finished_requests,
    idle_engine,
    wait_for_engine,
    wait_for_engine_to_drop,
)
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, LONG_TOKENS, MODEL, content_of, events, wait_until
from tests.support.live_server import LiveServer
from tests.support.raw_http import read_to_close

UPSTREAMS = BOTH_PATHS

# What a request to be cancelled asks for: twice a long reply (the most the paid tier and the test
# edges' context allow), so that a machine starved long enough for the tiny model to make a whole
# long reply (a CI run's Triton replica made 1,000 tokens in 604 ms before the edge relayed the
# first) is less likely to have made this one too when the cancel comes. Cancelled early, it costs
# no more time.
CANCELLED_MAX_TOKENS = 2 * LONG_TOKENS


def test_cancel_endpoint_stops_the_stream_and_frees_the_engine(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    before = idle_engine(server)
    body = long_body | {"max_tokens": CANCELLED_MAX_TOKENS}
    with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
        stream = events(response)
        rid = next(stream)["request_id"]
        assert next(stream)["choices"][0]["delta"]["content"] is not None  # generating now
        cancel = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
        assert cancel.status_code == 200, "the generation finished before the cancel (too fast?)"
        assert cancel.json() == {"request_id": rid, "status": "CANCELLED"}
        rest = list(stream)
    assert rest[-1] == DONE
    final = rest[-2]
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["floodgate"] == {"cancelled": True}
    after = wait_for_engine_to_drop(server, before)
    # Dropped, not finished: the engine stopped short of the tokens this request runs to.
    assert after.work - before.work < body["max_tokens"]


def test_a_cancelled_answer_not_streamed_is_the_reply_so_far_marked_cancelled(
    server: LiveServer, long_body: dict[str, Any]
) -> None:
    """Its client learns the id only with the answer (README); cancelled by it all the same, the
    waiting client gets a 200 with the text so far and the cancelled marker, charged what it got,
    and the engine drops the sequence."""
    before = idle_engine(server)
    registry = server.app.state.runtime.registry
    body = long_body | {"stream": False, "max_tokens": CANCELLED_MAX_TOKENS}
    earlier = set(registry.running())  # a request an earlier test left may still be ending
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        gaps = _gaps_relayed(server)
        waiting = pool.submit(client.post, CHAT, json=body, headers=server.auth("paid"))
        # Tokens the edge itself relayed, not the replica's count: on Triton that leads what reached
        # the edge (through its response sender and the stream), and a cancel found no text yet
        # once the count had moved (0 tokens), then again once it was 32 past (a CI run's starved
        # edge loop: the replica had made them in 45 ms).
        wait_until(lambda: _gaps_relayed(server) >= gaps + 8, what="the edge to relay the first tokens")
        ((rid, _),) = set(registry.running()) - earlier
        cancel = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
        answer = waiting.result()
    assert cancel.status_code == 200, "the generation finished before the cancel (too fast?)"
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["id"] == rid == answer.headers["x-request-id"]
    assert got["choices"][0]["finish_reason"] == "stop"
    assert got["floodgate"] == {"cancelled": True}
    assert 0 < got["usage"]["completion_tokens"] < body["max_tokens"]
    after = wait_for_engine(server, lambda r: r.idle, "the engine to drop the sequence")
    assert after.work - before.work < body["max_tokens"]


def test_a_repeated_cancel_of_a_cancelled_request_answers_it_cancelled_again(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    """A cancel is idempotent, as OpenAI's cancel of a cancelled response returns it as it is: a
    client retrying its cancel (a lost answer, a timeout) was told 409 `request_finished`, which
    reads as if the request had run to its end. The cancel of one that ended on its own stays 409
    (test below)."""
    body = long_body | {"max_tokens": CANCELLED_MAX_TOKENS}
    with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
        stream = events(response)
        rid = next(stream)["request_id"]
        assert next(stream)["choices"][0]["delta"]["content"] is not None  # generating now
        first = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
        assert first.status_code == 200, "the generation finished before the cancel (too fast?)"
        rest = list(stream)
    assert rest[-2]["floodgate"] == {"cancelled": True}
    again = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
    assert (again.status_code, again.json()) == (200, {"request_id": rid, "status": "CANCELLED"})
    other = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("free"))
    assert other.status_code == 404  # still not another user's to probe


def test_cancel_of_another_users_request_is_404_and_leaves_it_running(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    """Another user's cancel is told the request does not exist, and does nothing to it: it runs to
    its full length. The owner's cancel after it had been asserted a 200 (the request still
    running), which raced the tiny model on a starved machine: a CI run's Triton replica made all
    1,000 tokens before the owner's cancel arrived (409). Running it to its end proves more."""
    with client.stream("POST", CHAT, json=long_body, headers=server.auth("paid")) as response:
        stream = events(response)
        # Right after the first event: the replica may still be setting up the stream.
        rid = next(stream)["request_id"]
        other = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("free"))
        assert other.status_code == 404
        assert other.json()["error"]["code"] == "request_not_found"
        rest = list(stream)
    assert rest[-1] == DONE
    final = rest[-2]
    assert final["choices"][0]["finish_reason"] == "length"
    assert "floodgate" not in final  # no cancelled marker
    assert content_of(rest)
    own = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
    assert (own.status_code, own.json()["error"]["code"]) == (409, "request_finished")
    assert client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("free")).status_code == 404
    assert client.post(f"{CHAT}/chatcmpl-unknown/cancel", headers=server.auth("paid")).status_code == 404


def test_cancel_of_a_finished_request_is_409(server: LiveServer, client: httpx.Client) -> None:
    done = client.post(
        CHAT, json={"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 2}, headers=server.auth("paid")
    )
    rid = done.json()["id"]
    response = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "request_finished"


def test_the_openai_sdk_does_not_retry_the_cancel_of_a_finished_request(
    server: LiveServer, client: httpx.Client
) -> None:
    """A review: the SDK retries a 409 (it reads one as a lock timeout) unless told not to, so a
    cancel that came after the end was sent three times, 1.3 s, for the same answer."""
    done = client.post(
        CHAT, json={"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 2}, headers=server.auth("paid")
    )
    rid = done.json()["id"]
    sent: list[httpx.Request] = []
    with httpx.Client(event_hooks={"request": [sent.append]}) as http:
        sdk = openai.OpenAI(
            base_url=server.base_url + "/v1", api_key=server.keys["paid"], max_retries=2, http_client=http
        )
        with pytest.raises(openai.ConflictError) as conflict:
            sdk.post(f"/chat/completions/{rid}/cancel", cast_to=object)
    assert conflict.value.code == "request_finished"
    assert len(sent) == 1


def _gaps_relayed(server: LiveServer) -> float:
    """The edge's count of gaps between a reply's deltas, every model's (observed as it relays each
    delta after a reply's first, streamed or not): it moves only once the edge has the tokens."""
    pattern = r"^floodgate_inter_token_latency_seconds_count\{[^}]*\} ([0-9.e+]+)$"
    return sum(float(count) for count in re.findall(pattern, server.metrics_text(), re.MULTILINE))


def _raw_chat(server: LiveServer, body: dict[str, Any]) -> tuple[tuple[str, int], bytes]:
    """A chat request as bytes on the wire, and where to send them (a raw socket hangs up at will)."""
    content = httpx.Request("POST", server.base_url + CHAT, json=body, headers=server.auth("paid")).read()
    host, port = "127.0.0.1", int(server.base_url.rsplit(":", 1)[1])
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {server.keys['paid']}\r\nContent-Length: {len(content)}\r\n\r\n"
    )
    return (host, port), head.encode() + content


def _aborted_as_a_disconnect(
    server: LiveServer, disconnected: float, before: Any, max_tokens: int, *, seen_busy: bool = False
) -> None:
    """Hung up mid-generation: the edge must abort the sequence, not finish it. `seen_busy`: a
    reading after the request showed the replica busy, so any idle one since is after it (the
    request may have been dropped before its first step, its work none)."""
    wait_until(
        lambda: finished_requests(server, "disconnected") == disconnected + 1,
        what="the edge to see the disconnect",
    )
    if seen_busy:
        after = wait_for_engine(server, lambda r: r.idle, "the engine to drop the sequence")
    else:
        after = wait_for_engine_to_drop(server, before)
    assert after.work - before.work < max_tokens


@pytest.mark.parametrize("pipelined", [False, True])
def test_client_disconnect_aborts_the_generation(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any], pipelined: bool
) -> None:
    """Pipelined: uvicorn tells a disconnect only to a connection's latest request, there the one
    waiting its turn behind the stream: the stream's own generation must stop too."""
    disconnected = finished_requests(server, "disconnected")
    before = idle_engine(server)
    # Twice the usual length, as the other hang-ups here: a CI run's starved edge loop took 440 ms
    # to see the hang-up, and the replica, a process of its own, had run all 1,000 tokens by then.
    body = long_body | {"max_tokens": 2 * long_body["max_tokens"]}
    address, request = _raw_chat(server, body)
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(request * 2 if pipelined else request)
        # Hang up once a token has arrived (the first event, the role, comes before any).
        received = b""
        while received.count(b"data: {") < 2:
            data = sock.recv(65536)
            assert data, "the server closed the stream early"
            received += data
    _aborted_as_a_disconnect(server, disconnected, before, body["max_tokens"])


def test_a_websocket_upgrade_behind_a_running_request_is_answered_as_http(
    server: LiveServer, long_body: dict[str, Any]
) -> None:
    """Handed to uvicorn's WebSocket protocol, the upgrade took the connection from under the
    request running there: a 403, the connection closed, and the reply generated for no one. As
    HTTP, it is answered in its turn, and the connection closes after it (nothing after an upgrade
    is read): the request behind it goes unanswered, for the client to send again."""
    address, request = _raw_chat(server, long_body | {"stream": False, "max_tokens": 8})
    upgrade = (
        b"GET /healthz HTTP/1.1\r\nHost: e\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    last = b"GET /healthz HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n"
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(request + upgrade + last)
        responses = read_to_close(sock).split(b"HTTP/1.1 ")[1:]
    assert [r[:3] for r in responses] == [b"200", b"200"]
    assert b'"finish_reason"' in responses[0]
    assert b"connection: close" in responses[1].lower()


@pytest.mark.parametrize("pipelined", [0, 1, MAX_PIPELINED + 1], ids=["alone", "pipelined", "past-the-bound"])
def test_client_disconnect_aborts_a_non_stream_generation(
    server: LiveServer,
    client: httpx.Client,
    long_body: dict[str, Any],
    pipelined: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Pipelined: the client sends its next request while the first runs, then hangs up. uvicorn
    stopped reading the connection at the second request, so the close went unseen and the engine
    generated the whole reply for no one (a review: all its tokens, charged). Seen, the first
    request's 499 went into the closed transport, an ERROR with its traceback (a second review).
    Past the bound: one client writing requests in a loop had every one parsed and held (1,338
    waiting, 80 MB of bodies in 8 s); past MAX_PIPELINED waiting the edge closes the connection
    itself, as at a hang-up."""
    disconnected = finished_requests(server, "disconnected")
    before = idle_engine(server)
    # Twice the usual reply, past the end tokens: under load the whole of a 1,000-token reply once
    # ran before any poll below saw the replica busy (809 ms in a fresh-clone CI run, 1,567 ms in a
    # full-suite run beside two reviews), and the hang-up came after the end.
    body = long_body | {"stream": False, "max_tokens": 2 * long_body["max_tokens"]}
    address, request = _raw_chat(server, body)
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(request)
        # Not idle, rather than running: Triton's CPU model says so as it admits the request, before
        # its first step, where its count of running requests comes with the next periodic publish.
        wait_for_engine(server, lambda r: not r.idle, "the replica to take the request")
        sock.sendall(request * pipelined)
        if pipelined > MAX_PIPELINED:
            assert read_to_close(sock) == b""  # closed by the edge, nothing answered
    # Taken and dropped before its first step under load: no work, and a wait for some never ended.
    _aborted_as_a_disconnect(server, disconnected, before, body["max_tokens"], seen_busy=True)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
