"""What an operator reads of each request in the served edge's log: one line per request however it
ended, at a level that says whose fault it was.

An admitted request writes `chat_completion`, one the limiter or the queue turned away `chat_refused`
(both with the request id the client was given). A request refused before it got an id (a 400 for
its body, a 401 for its key, a 404, a 413) wrote nothing at all: a user reporting "every call
answers 400" left no trace an operator could find, and a flood of bad keys none either.

On an edge of its own: structlog's capture is process-wide, and the package's shared edge may still
be finishing another test's requests."""

from __future__ import annotations

import hashlib
import json
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from structlog.testing import LogCapture, capture_logs

from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL
from tests.faults.test_failed_requests_cost_nothing import FAIL_AFTER_3, FAIL_AT_ONCE, _failing_replicas
from tests.support.live_server import LiveServer, start_server
from tests.support.ports import free_port
from tests.support.raw_http import read_to_close

OK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
# The free tier takes one request; the second is the limiter's 429.
SETTINGS = {
    "tiers": {"paid": ROOMY_TIERS["paid"], "free": ROOMY_TIERS["free"] | {"requests_per_window": 1}},
    "server": {"max_body_bytes": 4096},
}
REQUEST_LINES = {"chat_completion", "chat_refused", "request_refused"}


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, SETTINGS) as live:
        yield live


def _lines_of(edge: LiveServer, send: Any) -> tuple[httpx.Response, list[dict[str, Any]]]:
    with httpx.Client(base_url=edge.base_url, timeout=60.0) as client, capture_logs() as logs:
        answer = send(client)
    return answer, [line for line in logs if line["event"] in REQUEST_LINES]


def test_each_refusal_before_admission_writes_one_info_line(edge: LiveServer) -> None:
    paid = edge.auth("paid")
    bad_key = {"Authorization": "Bearer x"}
    cases = [
        (400, None, "paid-user", lambda c: c.post(CHAT, content=b"{", headers=paid)),
        (400, None, "paid-user", lambda c: c.post(CHAT, json=OK | {"max_tokens": 10**6}, headers=paid)),
        (401, "invalid_api_key", None, lambda c: c.post(CHAT, json=OK, headers=bad_key)),
        (404, "model_not_found", "paid-user", lambda c: c.post(CHAT, json=OK | {"model": "m"}, headers=paid)),
        (404, None, None, lambda c: c.get("/v1/nothing-here")),
        (
            413,
            "request_too_large",
            "paid-user",
            lambda c: c.post(CHAT, json=OK | {"x": "y" * 5000}, headers=paid),
        ),
    ]
    ids = set()
    for status, code, user, send in cases:
        answer, lines = _lines_of(edge, send)
        assert answer.status_code == status, answer.text
        assert len(lines) == 1, (status, lines)
        line = lines[0]
        assert line["event"] == "request_refused" and line["log_level"] == "info", line
        assert line["status"] == status and line["code"] == (code or answer.json()["error"]["type"]), line
        assert line.get("user") == user and line["path"], line
        # The id the client was given names this line, a refusal's own (no completion to cancel),
        # and none from an earlier request is borrowed.
        assert line["request_id"] == answer.headers["x-request-id"], (line, answer.headers)
        assert line["request_id"].startswith("req-"), line
        ids.add(line["request_id"])
    assert len(ids) == len(cases), ids


def test_admitted_and_limited_requests_keep_their_one_line(edge: LiveServer) -> None:
    free = edge.auth("free")
    answer, lines = _lines_of(edge, lambda c: c.post(CHAT, json=OK, headers=free))
    assert answer.status_code == 200, answer.text
    assert [line["event"] for line in lines] == ["chat_completion"], lines
    answer, lines = _lines_of(edge, lambda c: c.post(CHAT, json=OK, headers=free))
    assert answer.status_code == 429, answer.text
    # The limiter's refusal is already its line, with the id the client was given: not a second.
    assert [line["event"] for line in lines] == ["chat_refused"], lines
    assert lines[0]["request_id"] == answer.headers["x-request-id"]


def test_a_refusal_at_the_stream_gates_door_writes_its_line_too(tmp_path: Path) -> None:
    """The gate answers a request past server.max_open_streams before the app sees it
    (edge/stream_gate.py)."""
    long = OK | {"max_tokens": 1000, "ignore_eos": True, "stream": True}
    with start_server(tmp_path, SETTINGS | {"server": {"max_open_streams": 1}}) as edge:
        with httpx.Client(base_url=edge.base_url, timeout=60.0) as client:
            with client.stream("POST", CHAT, json=long, headers=edge.auth("paid")) as held:
                assert held.status_code == 200
                lines_held = held.iter_lines()  # kept: a dropped iterator closes the response
                next(lines_held)  # the first event: the stream is open
                answer, lines = _lines_of(edge, lambda c: c.post(CHAT, json=OK, headers=edge.auth("paid")))
    assert answer.status_code == 429 and answer.json()["error"]["code"] == "server_busy", answer.text
    assert len(lines) == 1 and lines[0]["event"] == "request_refused", lines
    assert (lines[0]["status"], lines[0]["code"], lines[0]["log_level"]) == (429, "server_busy", "info")
    assert lines[0]["request_id"] == answer.headers["x-request-id"], (lines, answer.headers)


def _post(body: dict[str, Any], key: str, *, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode() + data


def test_a_pipelined_requests_lines_do_not_carry_the_request_id_of_the_one_before(edge: LiveServer) -> None:
    """uvicorn starts a request pipelined behind another from that one's last send, in its task: the
    new request's task copied the context with the earlier request's id bound, and each line it
    wrote before it got its own id (here the key store's failure) named the earlier request, a 200
    an operator then read as failed. With the context the server binds (merge_contextvars), as a
    served edge logs; structlog's capture_logs leaves it out."""
    store = edge.app.state.runtime.keys.store
    paid_digest = hashlib.sha256(edge.keys["paid"].encode()).hexdigest()
    real_get = store.get

    async def get(digest: str) -> Any:
        if digest != paid_digest:
            raise sqlite3.OperationalError("database is locked")
        return await real_get(digest)

    capture = LogCapture()
    before = structlog.get_config()
    store.get = get
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])
    try:
        with socket.create_connection(("127.0.0.1", edge.settings.server.port), timeout=60) as sock:
            sock.sendall(_post(OK, edge.keys["paid"]) + _post(OK, "sk-another-key", close=True))
            answers = read_to_close(sock)
    finally:
        structlog.configure(**before)
        store.get = real_get
    assert b"HTTP/1.1 200 OK" in answers and b"HTTP/1.1 503" in answers, answers
    (completion,) = [line for line in capture.entries if line["event"] == "chat_completion"]
    (store_down,) = [line for line in capture.entries if line["event"] == "key_store_unavailable"]
    assert completion["request_id"], completion
    assert store_down.get("request_id") is None, store_down
    # The 503's own id, in its answer and its refusal line, not the 200's.
    (refused,) = [line for line in capture.entries if line["event"] == "request_refused"]
    assert f"x-request-id: {refused['request_id']}\r\n".encode() in answers, (refused, answers)
    assert refused["request_id"] != completion["request_id"], refused


def test_a_refusal_for_the_servers_own_trouble_is_a_warning(tmp_path: Path) -> None:
    """The limiter's store down under a fail-closed tier: every request is answered 503
    limiter_unavailable, the server's fault, not the client's; each one's chat_refused line was info,
    as a user's 429 is, and warnings said only that the store's connection failed, not that every
    request was being turned away, nor whose."""
    overrides = {
        "tiers": {"paid": ROOMY_TIERS["paid"] | {"on_store_failure": "closed"}},
        "limiter": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0", "timeout_ms": 200},
    }
    with start_server(tmp_path, overrides) as edge:
        answer, lines = _lines_of(edge, lambda c: c.post(CHAT, json=OK, headers=edge.auth("paid")))
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "limiter_unavailable"
    refused = [line for line in lines if line["event"] == "chat_refused"]
    assert len(lines) == 1 and len(refused) == 1, lines
    assert refused[0]["log_level"] == "warning" and refused[0]["status"] == 503, refused
    assert refused[0]["request_id"] == answer.headers["x-request-id"]


def test_the_completion_line_says_the_status_and_error_the_client_got(tmp_path: Path) -> None:
    """A replica failing before its first token: not streamed, the client gets a 502 upstream_error;
    streamed, a 200 whose stream ends with that error event. Both lines said outcome "error" and
    nothing more: not which answer the client got (a 502 or a 200), nor which error (a replica's
    failure, the edge's own 500). The line now says the status and the error's code."""
    failing = OK | {"max_tokens": FAIL_AT_ONCE}
    with start_server(tmp_path, SETTINGS, _failing_replicas) as edge:
        paid = edge.auth("paid")
        for stream, status in ((False, 502), (True, 200)):
            answer, lines = _lines_of(
                edge, lambda c, body=failing | {"stream": stream}: c.post(CHAT, json=body, headers=paid)
            )
            assert answer.status_code == status, answer.text
            (line,) = lines
            assert line["event"] == "chat_completion" and line["outcome"] == "error", line
            assert (line["status"], line["error"]) == (status, "upstream_error"), line
        answer, lines = _lines_of(edge, lambda c: c.post(CHAT, json=OK, headers=paid))
        assert answer.status_code == 200
        assert (lines[0]["status"], lines[0]["error"]) == (200, None), lines


def test_every_key_routes_refusals_name_their_user(tmp_path: Path) -> None:
    """A route that reads a key first and then refuses wrote its request_refused line with user
    null: the history reads (a 400 for its query, a 404, the read limit's 429: whose loop was it?),
    cancel, models, a model's stats and usage (whose client sent a loop of 404s?), as a chat
    refusal's line names its user."""
    reads = {
        "tiers": SETTINGS["tiers"] | {"free": SETTINGS["tiers"]["free"] | {"history_reads_per_window": 1}}
    }
    history = "/v1/conversations/nothing-here/messages"
    with start_server(tmp_path, SETTINGS | reads) as edge:
        free = edge.auth("free")
        cases = [
            (400, lambda c: c.get(f"{history}?limit=0", headers=free)),
            (404, lambda c: c.get(history, headers=free)),
            (429, lambda c: c.get(history, headers=free)),
            (404, lambda c: c.post("/v1/chat/completions/chatcmpl-nobody/cancel", headers=free)),
            (404, lambda c: c.get("/v1/models/no-such-model", headers=free)),
            (404, lambda c: c.get("/v1/models/no-such-model/stats", headers=free)),
            (400, lambda c: c.get("/v1/usage?limit=0", headers=free)),
        ]
        for status, send in cases:
            answer, lines = _lines_of(edge, send)
            assert answer.status_code == status, answer.text
            (line,) = lines
            assert line["event"] == "request_refused" and line["status"] == status, line
            assert line.get("user") == "free-user", line


def test_every_line_a_request_causes_names_its_user_and_tier(tmp_path: Path) -> None:
    """A replica failing a request (before its first token, and mid-stream) writes lines of its own
    besides the request's (upstream_failover, replica_suspect, upstream_failed): they carried the
    request id bound for the request and not whose request it was, so an operator looking into one
    user's or one tier's errors found only the request's own line. With the context the server
    binds (merge_contextvars), as a served edge writes it."""
    with start_server(tmp_path, SETTINGS, _failing_replicas) as edge:
        with (
            httpx.Client(base_url=edge.base_url, timeout=60.0, headers=edge.auth("paid")) as client,
            capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs,
        ):
            for max_tokens in (FAIL_AT_ONCE, FAIL_AFTER_3):
                client.post(CHAT, json=OK | {"max_tokens": max_tokens, "stream": True}).read()
    caused = [line for line in logs if "request_id" in line and line["event"] not in REQUEST_LINES]
    assert {line["event"] for line in caused} >= {"upstream_failover", "upstream_failed"}, logs
    for line in caused:
        assert (line.get("user"), line.get("tier")) == ("paid-user", "paid"), line
