"""Cancelling through the endpoint and by hanging up both stop the engine's work."""

from __future__ import annotations

import re
import socket
from typing import Any

import httpx

from tests.edge.sse_client import (
    CHAT,
    DONE,
    LONG_PROMPT,
    MODEL,
    engine_idle,
    events,
    generated_tokens,
    wait_until,
)
from tests.support.live_server import LiveServer


def _finished(client: httpx.Client, reason: str) -> float:
    text = client.get("/metrics").text
    pattern = rf'floodgate_requests_finished_total\{{reason="{reason}",tier="paid"\}} ([0-9.e+]+)'
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


def test_cancel_endpoint_stops_the_stream_and_frees_the_engine(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    generated_before = generated_tokens(server)
    with client.stream("POST", CHAT, json=long_body, headers=server.auth("paid")) as response:
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
    wait_until(lambda: engine_idle(client, server.base_url), what="the engine to drop the sequence")
    # Dropped, not finished: the engine stopped short of the LONG_TOKENS this request runs to.
    assert generated_tokens(server) - generated_before < long_body["max_tokens"]
    again = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
    assert again.status_code == 409


def test_cancel_of_another_users_request_is_404(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    with client.stream("POST", CHAT, json=long_body, headers=server.auth("paid")) as response:
        stream = events(response)
        rid = next(stream)["request_id"]
        other = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("free"))
        assert other.status_code == 404
        assert other.json()["error"]["code"] == "request_not_found"
        assert client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid")).status_code == 200
        list(stream)
    assert client.post(f"{CHAT}/chatcmpl-unknown/cancel", headers=server.auth("paid")).status_code == 404


def test_cancel_of_a_finished_request_is_409(server: LiveServer, client: httpx.Client) -> None:
    done = client.post(
        CHAT, json={"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 2}, headers=server.auth("paid")
    )
    rid = done.json()["id"]
    response = client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid"))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "request_finished"


def test_client_disconnect_aborts_the_generation(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    before = _finished(client, "disconnected")
    generated_before = generated_tokens(server)
    body = httpx.Request("POST", server.base_url + CHAT, json=long_body, headers=server.auth("paid")).read()
    host, port = "127.0.0.1", int(server.base_url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=30) as sock:
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {server.keys['paid']}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        received = b""
        while b'"content":"' not in received.split(b"request_id", 1)[-1]:
            data = sock.recv(65536)
            assert data, "the server closed the stream early"
            received += data
    # Hung up mid-generation: the edge must abort the sequence, not finish it.
    wait_until(lambda: _finished(client, "disconnected") == before + 1, what="the edge to see the disconnect")
    wait_until(lambda: engine_idle(client, server.base_url), what="the engine to drop the sequence")
    assert generated_tokens(server) - generated_before < long_body["max_tokens"]


def test_client_disconnect_aborts_a_non_stream_generation(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    before = _finished(client, "disconnected")
    generated_before = generated_tokens(server)
    body = httpx.Request(
        "POST", server.base_url + CHAT, json=long_body | {"stream": False}, headers=server.auth("paid")
    ).read()
    host, port = "127.0.0.1", int(server.base_url.rsplit(":", 1)[1])

    def running() -> bool:
        replicas = client.get("/v1/internal/engine").json()["replicas"]
        return any(r["running"] > 0 for r in replicas)

    with socket.create_connection((host, port), timeout=30) as sock:
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {server.keys['paid']}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        wait_until(running, what="the generation to start")
    wait_until(lambda: _finished(client, "disconnected") == before + 1, what="the edge to see the disconnect")
    wait_until(lambda: engine_idle(client, server.base_url), what="the engine to drop the sequence")
    assert generated_tokens(server) - generated_before < long_body["max_tokens"]
