"""What an operator reads of a cancel call in the served edge's log: one `chat_cancel` line per call,
naming the request it cancelled, whose call it was, how it ended and which edge answered it.

A cancel through the endpoint wrote no line of its own: the stream's chat_completion line says
`cancelled` whether the endpoint or its client's hang-up stopped it, and a cancel that found nothing
wrote only a request_refused line under an id of its own, naming no stream. An operator asked "did
my cancel reach it?" had nothing to read.

On edges of their own: structlog's capture is process-wide, and the package's shared edge may still
be finishing another test's requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, events
from tests.support.live_server import LiveServer, start_server
from tests.support.redis_server import start_redis

TIERS = {"tiers": {"paid": ROOMY_TIERS["paid"], "free": ROOMY_TIERS["free"]}}
HI = [{"role": "user", "content": "hi"}]
LONG = {"model": MODEL, "messages": HI, "max_tokens": 1000, "ignore_eos": True, "stream": True}
SHORT = {"model": MODEL, "messages": HI, "max_tokens": 2}


def _cancel_lines(send: Any) -> tuple[httpx.Response, list[dict[str, Any]]]:
    with capture_logs() as logs:
        answer = send()
    return answer, [line for line in logs if line["event"] == "chat_cancel"]


def _expect(line: dict[str, Any], rid: str, outcome: str, via: str, user: str = "paid-user") -> None:
    assert (line["request_id"], line["outcome"], line["via"]) == (rid, outcome, via), line
    assert (line["user"], line["tier"], line["log_level"]) == (user, user.removesuffix("-user"), "info"), line
    assert not any("sk-" in str(value) for value in line.values()), line  # never the key


def test_each_cancel_call_writes_one_line_with_its_outcome(tmp_path: Path) -> None:
    with start_server(tmp_path, TIERS) as edge, httpx.Client(base_url=edge.base_url, timeout=60) as client:
        paid = edge.auth("paid")
        with client.stream("POST", CHAT, json=LONG, headers=paid) as response:
            stream = events(response)
            rid = next(stream)["request_id"]
            answer, lines = _cancel_lines(lambda: client.post(f"{CHAT}/{rid}/cancel", headers=paid))
            assert answer.status_code == 200, answer.text
            list(stream)
        (line,) = lines
        _expect(line, rid, "cancelled", "local")
        # Another user's call names that user, and answers as for an unknown id.
        answer, (line,) = _cancel_lines(
            lambda: client.post(f"{CHAT}/{rid}/cancel", headers=edge.auth("free"))
        )
        assert answer.status_code == 404
        _expect(line, rid, "not_found", "local", user="free-user")
        done = client.post(CHAT, json=SHORT, headers=paid).json()["id"]
        answer, (line,) = _cancel_lines(lambda: client.post(f"{CHAT}/{done}/cancel", headers=paid))
        assert answer.status_code == 409
        _expect(line, done, "finished", "local")
        # An id of any length is cut, as every echo of the caller's input is.
        long_id = "chatcmpl-" + "x" * 500
        answer, (line,) = _cancel_lines(lambda: client.post(f"{CHAT}/{long_id}/cancel", headers=paid))
        assert answer.status_code == 404
        _expect(line, long_id[:64], "not_found", "local")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[LiveServer, LiveServer]]:
    redis = start_redis()
    overrides = TIERS | {
        "limiter": {"backend": "redis", "instance_count": 2, "timeout_ms": 2000, "redis_url": redis.url}
    }
    try:
        with start_server(tmp_path, overrides) as a:
            shared_keys = {"keys": {"sqlite_path": a.settings.keys.sqlite_path}}
            with start_server(tmp_path / "b", overrides | shared_keys) as b:
                yield a, b
    finally:
        redis.stop()


def test_a_cancel_answered_through_the_store_says_so(fleet: tuple[LiveServer, LiveServer]) -> None:
    """The stream runs on A; B takes its cancel and answers it from the fleet's store."""
    a, b = fleet
    paid = a.auth("paid")
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", a.base_url + CHAT, json=LONG, headers=paid) as response:
            stream = events(response)
            rid = next(stream)["request_id"]
            answer, lines = _cancel_lines(
                lambda: client.post(f"{b.base_url}{CHAT}/{rid}/cancel", headers=paid)
            )
            assert answer.status_code == 200, answer.text
            list(stream)
    (line,) = lines
    _expect(line, rid, "cancelled", "bus")
