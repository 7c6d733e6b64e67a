"""A request's headers must arrive within [server] header_timeout_s, on a served edge over raw
sockets: a client that connects and sends nothing, or stops halfway through its headers, no longer
holds its connection for ever (edge/header_timeout.py)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live_server import LiveServer, start_server
from tests.support.raw_http import get_healthz, read_to_close

# Every one of these would wait for ever without the deadline; this bounds the test instead.
GIVE_UP_S = 10.0
HEADERS_OF_A_CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, {"server": {"header_timeout_s": 0.3}}) as live:
        yield live


def _connect(live: LiveServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", live.settings.server.port), timeout=GIVE_UP_S)


def _json_response(raw: bytes) -> tuple[bytes, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, json.loads(body)


def test_a_connection_that_sends_nothing_is_closed(edge: LiveServer) -> None:
    with _connect(edge) as sock:
        assert read_to_close(sock) == b""


def test_headers_that_stop_halfway_get_a_408_and_the_connection_closes(edge: LiveServer) -> None:
    counted = edge.rejected(408)
    with _connect(edge) as sock:
        sock.sendall(HEADERS_OF_A_CHAT)
        head, body = _json_response(read_to_close(sock))
    assert edge.rejected(408) == counted + 1

    assert head.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in head.lower()
    assert body["error"]["code"] == "request_timeout"  # type: ignore[index]
    assert "headers" in body["error"]["message"]  # type: ignore[index]


def test_the_next_request_on_a_kept_alive_connection_is_timed_too(edge: LiveServer) -> None:
    with _connect(edge) as sock:
        first = get_healthz(sock)
        sock.sendall(HEADERS_OF_A_CHAT)
        head, body = _json_response(read_to_close(sock))

    assert first.startswith(b"HTTP/1.1 200 ")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert body["error"]["code"] == "request_timeout"  # type: ignore[index]


def test_a_request_pipelined_behind_a_response_is_timed_once_that_response_is_written(
    edge: LiveServer,
) -> None:
    # Its first bytes come with the request before it, so they are read while that one is answered
    # (when a 408 would cut the response); the trickle after it cancels uvicorn's keep-alive timer,
    # so without a deadline of its own this connection stays open for ever.
    with _connect(edge) as sock:
        first = get_healthz(sock, pipelined=HEADERS_OF_A_CHAT)
        sock.sendall(b"x-trickle: 1\r\n")
        head, body = _json_response(read_to_close(sock))

    assert first.startswith(b"HTTP/1.1 200 ")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert body["error"]["code"] == "request_timeout"  # type: ignore[index]


def test_a_request_pipelined_behind_two_is_timed_once_both_are_written(edge: LiveServer) -> None:
    """A runs, B waits its turn, C's headers stop halfway: C's deadline starts once B's response
    is written, not A's, whose start cut B's stream with C's 408 (a review)."""

    def chat(stream: bool) -> bytes:
        payload = json.dumps(
            {
                "model": "floodgate-tiny",
                "messages": [{"role": "user", "content": "hi"}],
                # Long past the deadline: B runs on well after A ends.
                "max_tokens": 2000,
                "ignore_eos": True,
                "stream": stream,
            }
        ).encode()
        return (
            HEADERS_OF_A_CHAT
            + f"authorization: Bearer {edge.keys['paid']}\r\ncontent-type: application/json\r\n".encode()
            + f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )

    with _connect(edge) as sock:
        sock.sendall(chat(stream=False) + chat(stream=True) + HEADERS_OF_A_CHAT)
        responses = read_to_close(sock).split(b"HTTP/1.1 ")[1:]

    assert [r[:3] for r in responses] == [b"200", b"200", b"408"]
    assert b"data: [DONE]" in responses[1]


def test_a_request_whose_headers_came_in_time_is_not_cut(edge: LiveServer) -> None:
    # The body comes after the header deadline has passed; it has its own (body_timeout_s, 30 s).
    payload = json.dumps(
        {"model": "floodgate-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()
    key = edge.keys["paid"]
    with _connect(edge) as sock:
        sock.sendall(
            HEADERS_OF_A_CHAT
            + f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n".encode()
            + f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode()
        )
        # Not synchronisation: the point is to be later than the header deadline.
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.settimeout(GIVE_UP_S)
        sock.sendall(payload)
        head, body = _json_response(read_to_close(sock))

    assert head.startswith(b"HTTP/1.1 200 "), head
    assert body["object"] == "chat.completion"


def test_a_request_answered_before_its_body_was_read_does_not_hold_the_connection(edge: LiveServer) -> None:
    """No key: 401 before the body is read. A client trickling the rest of the body (a byte at a
    time, each cancelling the keep-alive timer) held the connection for ever; now it closes once
    the header deadline has passed, the trickle notwithstanding."""
    with _connect(edge) as sock:
        sock.sendall(HEADERS_OF_A_CHAT + b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n{")
        sock.settimeout(0.1)
        received = b""
        closed = False
        for _ in range(int(GIVE_UP_S / 0.1)):  # a byte every 0.1 s, until the server closes
            try:
                sock.sendall(b"x")
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
            if chunk == b"":
                closed = True
                break
            received += chunk
    assert received.startswith(b"HTTP/1.1 401 ")
    assert closed, f"still open after {GIVE_UP_S:g} s of trickling"
