"""The answers the HTTP protocol writes itself, before any request reaches the app (a request the
parser refuses, a head too large, a transfer coding it cannot decode, headers that never finished),
carry an `x-request-id` and write their `request_refused` line under it, as every other error answer
does (edge/errors.py log_refusal). Without one, a user reporting "every call answers 400" had no id to
quote, and the operator no line to find.

On an edge of its own: structlog's capture is process-wide."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.live_server import LiveServer, start_server
from tests.support.raw_http import read_to_close

CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
PAD = b"x-pad: " + b"a" * 1000 + b"\r\n"
REQUESTS = {
    "invalid_http_request": (400, CHAT + b"content-length: abc\r\n\r\n"),
    "request_header_fields_too_large": (431, CHAT + PAD * 100 + b"\r\n"),
    "unsupported_transfer_coding": (501, CHAT + b"transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
    "http_version_not_supported": (505, b"GET /healthz HTTP/2.0\r\nhost: x\r\n\r\n"),
    # Headers that never end: the header deadline's 408.
    "request_timeout": (408, CHAT),
}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("refusal-ids"), {"server": {"header_timeout_s": 0.3}}) as live:
        yield live


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _exchange(
    live: LiveServer, request: bytes
) -> tuple[bytes, list[dict[str, Any]], list[logging.LogRecord]]:
    """The answer, its request_refused lines, and the warnings uvicorn's logger wrote meanwhile (it
    does not propagate to the root logger, so it is watched itself)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    watch = _Warnings()
    uvicorn_log.addHandler(watch)
    try:
        with capture_logs() as logs:
            with socket.create_connection(("127.0.0.1", live.settings.server.port), timeout=30) as sock:
                sock.sendall(request)
                answer = read_to_close(sock)
    finally:
        uvicorn_log.removeHandler(watch)
    return answer, [line for line in logs if line["event"] == "request_refused"], watch.records


def _header(head: bytes, name: bytes) -> str:
    values = [
        line.split(b":", 1)[1].strip().decode()
        for line in head.split(b"\r\n")[1:]
        if line.split(b":", 1)[0].strip().lower() == name
    ]
    assert len(values) == 1, head
    return values[0]


@pytest.mark.parametrize("code", list(REQUESTS))
def test_a_protocol_refusal_carries_a_request_id_that_names_its_line(edge: LiveServer, code: str) -> None:
    status, request = REQUESTS[code]
    answer, lines, warnings = _exchange(edge, request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:300]
    assert json.loads(body)["error"]["code"] == code
    request_id = _header(head, b"x-request-id")
    assert request_id.startswith("req-"), request_id
    assert len(lines) == 1, lines
    line = lines[0]
    assert (line["request_id"], line["status"], line["code"]) == (request_id, status, code), line
    # Every one is the client's doing, the 501 and 505 too (a coding, a version it chose): info, as
    # every other client-caused refusal's line; a warning says the server's own trouble.
    assert line["log_level"] == "info", line
    # ... and no other line says it louder (uvicorn's "Invalid HTTP request received." warning).
    assert not warnings, [record.getMessage() for record in warnings]


def test_each_protocol_refusal_has_an_id_of_its_own(edge: LiveServer) -> None:
    """The answer is made once, at import: the id must not be made with it."""
    _, request = REQUESTS["invalid_http_request"]
    ids = {_header(_exchange(edge, request)[0].partition(b"\r\n\r\n")[0], b"x-request-id") for _ in range(3)}
    assert len(ids) == 3, ids


def test_a_refusal_behind_a_request_being_answered_names_its_own_id(edge: LiveServer) -> None:
    """Put off until the answer before it is written (edge/http_protocol.py `_refusal`): its id and
    line are still its own."""
    _, bad = REQUESTS["invalid_http_request"]
    answer, lines, _ = _exchange(edge, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" + bad)
    first, _, rest = answer.partition(b"HTTP/1.1 400 ")
    assert first.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert len(lines) == 1, lines
    assert (
        _header(b"HTTP/1.1 400 " + rest.partition(b"\r\n\r\n")[0], b"x-request-id") == lines[0]["request_id"]
    )
