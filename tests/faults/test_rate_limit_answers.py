"""What a 429 from `floodgate serve` on a real Redis tells the client: the x-ratelimit-* headers
OpenAI's API sends, and a Retry-After that is the real wait for each limit (requests and tokens:
the bucket's refill time; concurrency: when a running stream should end, never a fixed hint)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from tests.edge.sse_client import CHAT, LONG_PROMPT, LONG_TOKENS, MODEL, find_long_seed
from tests.faults.serve_process import ServeProcess, serve_process
from tests.faults.stalled_client import open_stalled
from tests.support.redis_server import RedisServer, start_redis

# OpenAI's names (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers").
OPENAI_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)
# Go's duration format, as OpenAI writes resets: "20ms", "1s", "6m0s", "1h2m3.5s".
DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")
REQUEST_WINDOW_S = 3600
TOKENS = 2000


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.kill()


def _serve(
    tmp_path: Path, redis: RedisServer, sections: dict[str, dict[str, object]] | None = None, **paid: object
) -> AbstractContextManager[ServeProcess]:
    limiter: dict[str, object] = {"backend": "redis", "redis_url": redis.url}
    return serve_process(tmp_path, {"limiter": limiter, "tiers.paid": paid, **(sections or {})})


def _body(max_tokens: int, *, stream: bool = False) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _ms(duration: str) -> float:
    """An OpenAI reset duration in milliseconds."""
    assert DURATION.match(duration), duration
    if duration.endswith("ms"):
        return float(duration[:-2])
    total = 0.0
    for value, unit in re.findall(r"([\d.]+)([hms])", duration):
        total += float(value) * {"h": 3_600_000, "m": 60_000, "s": 1000}[unit]
    return total


def _assert_openai_headers(response: httpx.Response) -> None:
    for name in OPENAI_HEADERS:
        assert name in response.headers, name
    for kind in ("requests", "tokens"):
        assert int(response.headers[f"x-ratelimit-limit-{kind}"]) > 0
        assert int(response.headers[f"x-ratelimit-remaining-{kind}"]) >= 0
        _ms(response.headers[f"x-ratelimit-reset-{kind}"])


def _assert_retry_after(response: httpx.Response) -> int:
    """Whole seconds >= 1 (HTTP), the exact wait rounded up; returns the exact ms."""
    exact_ms = int(response.headers["retry-after-ms"])
    assert int(response.headers["retry-after"]) == max(1, math.ceil(exact_ms / 1000))
    return exact_ms


def test_a_request_limit_429_waits_for_the_next_request_to_refill(tmp_path: Path, redis: RedisServer) -> None:
    with _serve(tmp_path, redis, requests_per_window=2, request_window_s=REQUEST_WINDOW_S) as server:
        with httpx.Client(base_url=server.base_url, headers=server.auth(), timeout=60) as client:
            for _ in range(2):
                ok = client.post(CHAT, json=_body(4))
                assert ok.status_code == 200
                _assert_openai_headers(ok)
            denied = client.post(CHAT, json=_body(4))
    assert denied.status_code == 429 and denied.json()["error"]["type"] == "requests"
    _assert_openai_headers(denied)
    interval_ms = REQUEST_WINDOW_S * 1000 / 2
    # One request refills every interval: the wait is what is left of it, not the whole window.
    assert interval_ms - 60_000 < _assert_retry_after(denied) <= interval_ms
    assert int(denied.headers["x-ratelimit-remaining-requests"]) == 0
    # Back to a full bucket once both requests have refilled.
    assert 2 * interval_ms - 60_000 < _ms(denied.headers["x-ratelimit-reset-requests"]) <= 2 * interval_ms


def test_a_token_limit_429_waits_for_the_missing_tokens_to_refill(tmp_path: Path, redis: RedisServer) -> None:
    interval_ms = REQUEST_WINDOW_S * 1000 / TOKENS
    with _serve(tmp_path, redis, tokens_per_window=TOKENS, token_window_s=REQUEST_WINDOW_S) as server:
        with httpx.Client(base_url=server.base_url, headers=server.auth(), timeout=60) as client:
            first = client.post(CHAT, json=_body(32))
            assert first.status_code == 200
            prompt = first.json()["usage"]["prompt_tokens"]
            denied = None
            for _ in range(TOKENS):  # each request costs its prompt and its output lease up front
                response = client.post(CHAT, json=_body(32))
                if response.status_code == 429:
                    denied = response
                    break
                assert response.status_code == 200
    assert denied is not None and denied.json()["error"]["type"] == "tokens"
    _assert_openai_headers(denied)
    # The denied request needed prompt + 32 tokens (its first output lease); it waits for exactly
    # the missing ones to refill, each one interval.
    missing = prompt + 32 - int(denied.headers["x-ratelimit-remaining-tokens"])
    assert missing > 0
    assert (missing - 1) * interval_ms - 60_000 < _assert_retry_after(denied) <= missing * interval_ms
    assert _ms(denied.headers["x-ratelimit-reset-tokens"]) >= _assert_retry_after(denied)


def _concurrency_denial(server: ServeProcess) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, headers=server.auth(), timeout=60) as client:
        seed = find_long_seed(client, server.key)
        # A long stream that is never read holds the one slot (its sends wait on a full socket).
        body = {
            "model": MODEL,
            "messages": LONG_PROMPT,
            "seed": seed,
            "max_tokens": LONG_TOKENS,
            "stream": True,
        }
        sock = open_stalled(server.base_url, server.key, body)
        try:
            # Its status line says it holds the slot; past that the test reads nothing more.
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
            return client.post(CHAT, json=_body(4))
        finally:
            sock.close()


def test_a_concurrency_429_waits_for_a_running_stream_not_a_fixed_second(
    tmp_path: Path, redis: RedisServer
) -> None:
    stall: dict[str, dict[str, object]] = {"server": {"stalled_reader_s": 120.0, "send_buffer_bytes": 4096}}
    with _serve(tmp_path, redis, max_concurrent=1, sections=stall) as server:
        denied = _concurrency_denial(server)
    assert denied.status_code == 429 and denied.json()["error"]["type"] == "concurrency"
    _assert_openai_headers(denied)
    exact_ms = _assert_retry_after(denied)
    # The store's bound is the slot's lease (300 s); the estimate (when the running stream should
    # end, tests/limiter/test_concurrency_wait.py checks its values) lies below it.
    assert 0 < exact_ms < 300_000
