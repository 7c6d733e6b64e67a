"""A web page on another origin calls the API as a browser does (edge/cors.py): the preflight, then
the request, each answer readable by the page, its refusals included."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from tests.edge.sse_client import MODEL
from tests.support.live_server import LiveServer, start_server
from tests.support.raw_http import read_to_close

ORIGIN = "https://chat.example.com"
# What the openai SDK's fetch asks a preflight to allow.
SDK_HEADERS = "authorization, content-type, x-stainless-lang, x-stainless-retry-count"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _preflight(client: httpx.Client, origin: str) -> httpx.Response:
    return client.options(
        "/v1/chat/completions",
        headers={
            "origin": origin,
            "access-control-request-method": "POST",
            "access-control-request-headers": SDK_HEADERS,
        },
    )


def test_a_browser_page_may_call_the_api(server: LiveServer, client: httpx.Client) -> None:
    preflight = _preflight(client, ORIGIN)
    assert preflight.is_success
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    # Authorization named: a wildcard would not cover it.
    assert preflight.headers["access-control-allow-headers"] == SDK_HEADERS
    assert "access-control-allow-credentials" not in preflight.headers

    from_page = {"origin": ORIGIN, **server.auth("paid")}
    answered = client.post("/v1/chat/completions", json=BODY, headers=from_page)
    assert answered.status_code == 200
    assert answered.headers["access-control-allow-origin"] == "*"
    # The SDK reads x-request-id, Retry-After and the rate limits: the page may read every header.
    assert answered.headers["access-control-expose-headers"] == "*"
    with client.stream(
        "POST", "/v1/chat/completions", json={**BODY, "stream": True}, headers=from_page
    ) as sse:
        assert sse.headers["access-control-allow-origin"] == "*"
        assert sse.read().endswith(b"data: [DONE]\n\n")

    refused = client.post("/v1/chat/completions", json=BODY, headers={"origin": ORIGIN})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == "*"
    assert refused.json()["error"]["code"] == "invalid_api_key"
    models = client.get("/v1/models", headers=from_page)
    assert models.headers["access-control-allow-origin"] == "*"

    # A server-side client sends no Origin: its answers are as they were.
    assert "access-control-allow-origin" not in client.get("/v1/models", headers=server.auth("paid")).headers


def test_only_the_origins_configured_may(tmp_path: Path) -> None:
    with (
        start_server(tmp_path, {"server": {"cors_allow_origins": [ORIGIN]}}) as live,
        httpx.Client(base_url=live.base_url, timeout=30.0) as client,
    ):
        allowed = _preflight(client, ORIGIN)
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        assert allowed.headers["vary"] == "Origin"
        other = _preflight(client, "https://elsewhere.example")
        assert "access-control-allow-origin" not in other.headers
        assert "access-control-allow-methods" not in other.headers
        answered = client.get("/v1/models", headers={"origin": ORIGIN, **live.auth("paid")})
        assert answered.headers["access-control-allow-origin"] == ORIGIN


PAD = b"x-pad: " + b"a" * 1000 + b"\r\n"
# Answered by the HTTP protocol itself, no request reaching the app (a request line, its headers).
PROTOCOL_REFUSALS = {
    400: b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\norigin: %b\r\ncontent-length: abc\r\n\r\n",
    431: b"GET /v1/models HTTP/1.1\r\nhost: x\r\norigin: %b\r\n" + PAD * 100 + b"\r\n",
    501: b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\norigin: %b\r\n"
    b"transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    505: b"GET /v1/models HTTP/2.0\r\nhost: x\r\norigin: %b\r\n\r\n",
    # Headers that never end: the header deadline's 408 (a header after the Origin: the parser
    # hands a header on once the next one begins).
    408: b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\norigin: %b\r\ncontent-type: application/json\r\n",
}


def _refusal_head(live: LiveServer, request: bytes) -> dict[bytes, bytes]:
    with socket.create_connection(("127.0.0.1", live.settings.server.port), timeout=30) as sock:
        sock.sendall(request)
        answer = read_to_close(sock)
    head = answer.partition(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0].startswith(b"HTTP/1.1 4") or head[0].startswith(b"HTTP/1.1 5"), answer[:300]
    fields = (line.split(b": ", 1) for line in head[1:])
    return {name.lower(): value for name, value in fields}


def test_a_page_may_read_the_refusals_the_http_protocol_writes_itself(tmp_path: Path) -> None:
    """A 431, a 408 at the header deadline, a 400, 501 or 505 for what the parser refuses are written
    by the HTTP protocol, where the app (and the CORS wrapper around it) never runs: they went out
    with no Access-Control-Allow-Origin, and a page on another origin saw a bare "CORS error" where
    the answer said what to fix. They carry the same headers as every other answer now."""
    settings = {"server": {"header_timeout_s": 0.3, "cors_allow_origins": [ORIGIN]}}
    with start_server(tmp_path, settings) as live:
        for status, request in PROTOCOL_REFUSALS.items():
            fields = _refusal_head(live, request % ORIGIN.encode())
            assert fields.get(b"access-control-allow-origin") == ORIGIN.encode(), (status, fields)
            assert fields[b"vary"] == b"Origin", (status, fields)
            assert fields[b"access-control-expose-headers"] == b"*", (status, fields)
            other = _refusal_head(live, request % b"https://elsewhere.example")
            assert b"access-control-allow-origin" not in other, (status, other)


def test_any_origin_may_read_a_refusal_cut_before_its_origin(server: LiveServer) -> None:
    """Any origin allowed (the default), a head refused before its Origin was read (a 431 past the
    bound) is readable all the same: the answer is the same whatever the origin."""
    cut = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + PAD * 100 + b"origin: " + ORIGIN.encode() + b"\r\n\r\n"
    fields = _refusal_head(server, cut)
    assert fields[b"access-control-allow-origin"] == b"*", fields
    assert fields[b"access-control-expose-headers"] == b"*", fields
