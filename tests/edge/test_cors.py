"""A web page on another origin calls the API as a browser does (edge/cors.py): the preflight, then
the request, each answer readable by the page, its refusals included."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.edge.sse_client import MODEL
from tests.support.live_server import LiveServer, start_server

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
