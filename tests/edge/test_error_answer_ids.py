"""Every error answer of the edge, on either listener and every route, carries an `x-request-id`
that names its one log line (README: `req-…` for a refusal before admission, the request's own
`chatcmpl-…` for the limiter's and the queue's), so a user quoting the id of any 4xx or 5xx leads
the operator to its line. The HTTP layer's own answers are tests/edge/test_protocol_refusal_ids.py's;
errors inside a stream are events, with the stream's id.

On edges of their own: structlog's capture is process-wide."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from edge.config import Settings
from edge.upstreams.base import Upstream
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL
from tests.edge.test_stream_gate_reserve import HeldUpstream
from tests.support.live_server import LiveServer, start_server
from tests.support.raw_http import read_to_close

ADMIN_KEY = "sk-admin-error-ids"
OK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
HELD = OK | {"stream": True}  # held after its first token (HeldUpstream)
# One request of the free tier's: its second is the limiter's 429.
SETTINGS = {
    "tiers": {"paid": ROOMY_TIERS["paid"], "free": ROOMY_TIERS["free"] | {"requests_per_window": 1}},
    "server": {"max_body_bytes": 4096},
    "keys": {"admin_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()},
}
REQUEST_LINES = {"request_refused", "chat_refused", "store_unavailable", "unhandled_error"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
BAD_KEY = {"Authorization": "Bearer sk-nobody"}
Send = Callable[[httpx.Client, LiveServer], httpx.Response]


def _paid(live: LiveServer) -> dict[str, str]:
    return live.auth("paid")


# (name, status, send): what each route can answer with an error, short of a store or a replica down.
PUBLIC: list[tuple[str, int, Send]] = [
    ("chat: body not JSON", 400, lambda c, e: c.post(CHAT, content=b"{", headers=_paid(e))),
    ("chat: field of the wrong type", 400, lambda c, e: c.post(CHAT, json={"model": 3}, headers=_paid(e))),
    (
        "chat: max_tokens past the tier",
        400,
        lambda c, e: c.post(CHAT, json=OK | {"max_tokens": 10**6}, headers=_paid(e)),
    ),
    ("chat: no key", 401, lambda c, e: c.post(CHAT, json=OK)),
    ("chat: unknown key", 401, lambda c, e: c.post(CHAT, json=OK, headers=BAD_KEY)),
    ("chat: unknown model", 404, lambda c, e: c.post(CHAT, json=OK | {"model": "m"}, headers=_paid(e))),
    ("chat: GET", 405, lambda c, e: c.get(CHAT, headers=_paid(e))),
    ("chat: body too large", 413, lambda c, e: c.post(CHAT, json=OK | {"x": "y" * 5000}, headers=_paid(e))),
    (
        "chat: gzipped body",
        415,
        lambda c, e: c.post(CHAT, json=OK, headers=_paid(e) | {"content-encoding": "gzip"}),
    ),
    ("cancel: no key", 401, lambda c, e: c.post(CHAT + "/chatcmpl-x/cancel")),
    ("cancel: unknown request", 404, lambda c, e: c.post(CHAT + "/chatcmpl-x/cancel", headers=_paid(e))),
    ("cancel: GET", 405, lambda c, e: c.get(CHAT + "/chatcmpl-x/cancel", headers=_paid(e))),
    ("models: no key", 401, lambda c, e: c.get("/v1/models")),
    ("model: unknown", 404, lambda c, e: c.get("/v1/models/nope", headers=_paid(e))),
    ("model stats: unknown", 404, lambda c, e: c.get("/v1/models/nope/stats", headers=_paid(e))),
    ("usage: no key", 401, lambda c, e: c.get("/v1/usage")),
    ("usage: bad start", 400, lambda c, e: c.get("/v1/usage?start=zz", headers=_paid(e))),
    ("usage: repeated start", 400, lambda c, e: c.get("/v1/usage?start=1&start=2", headers=_paid(e))),
    ("conversation: no key", 401, lambda c, e: c.get("/v1/conversations/c1/messages")),
    ("conversation: unknown", 404, lambda c, e: c.get("/v1/conversations/c1/messages", headers=_paid(e))),
    (
        "conversation: bad limit",
        400,
        lambda c, e: c.get("/v1/conversations/c1/messages?limit=zz", headers=_paid(e)),
    ),
    ("admin: no key", 401, lambda c, e: c.get("/v1/admin/keys")),
    ("admin: a user's key", 401, lambda c, e: c.get("/v1/admin/keys", headers=_paid(e))),
    ("admin: body not JSON", 400, lambda c, e: c.post("/v1/admin/keys", content=b"{", headers=ADMIN)),
    (
        "admin: unknown tier",
        400,
        lambda c, e: c.post("/v1/admin/keys", json={"user": "u", "tier": "gold"}, headers=ADMIN),
    ),
    ("admin: unknown key", 404, lambda c, e: c.post("/v1/admin/keys/nope/revoke", headers=ADMIN)),
    ("admin: DELETE", 405, lambda c, e: c.delete("/v1/admin/keys", headers=ADMIN)),
    ("admin: body too large", 413, lambda c, e: c.post("/v1/admin/keys", content=b"x" * 9000, headers=ADMIN)),
    ("admin usage: bad start", 400, lambda c, e: c.get("/v1/admin/usage?start=zz", headers=ADMIN)),
    ("unknown path", 404, lambda c, e: c.get("/nowhere")),
    ("unknown path, HEAD", 404, lambda c, e: c.head("/nowhere")),
    ("an operator route", 404, lambda c, e: c.get("/metrics")),
    ("playground: POST", 405, lambda c, e: c.post("/")),
]
OPERATOR: list[tuple[str, int, Send]] = [
    ("ops: chat", 404, lambda c, e: c.post(CHAT, json=OK, headers=_paid(e))),
    ("ops: unknown path", 404, lambda c, e: c.get("/nowhere")),
    ("ops: metrics POST", 405, lambda c, e: c.post("/metrics")),
    ("ops: admin no key", 401, lambda c, e: c.get("/v1/admin/keys")),
    ("ops: admin unknown key", 404, lambda c, e: c.post("/v1/admin/keys/nope/revoke", headers=ADMIN)),
    ("ops: admin DELETE", 405, lambda c, e: c.delete("/v1/admin/keys", headers=ADMIN)),
    (
        "ops: admin body too large",
        413,
        lambda c, e: c.post("/v1/admin/keys", content=b"x" * 9000, headers=ADMIN),
    ),
]


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("error-ids"), SETTINGS) as live:
        yield live


def _lines_named(answer_id: str | None, logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] in REQUEST_LINES and line.get("request_id") == answer_id]


def _assert_named(answer: httpx.Response, logs: list[dict[str, Any]], prefix: str = "req-") -> None:
    request_id = answer.headers.get("x-request-id")
    assert request_id is not None and request_id.startswith(prefix), (answer.status_code, answer.headers)
    lines = _lines_named(request_id, logs)
    assert len(lines) == 1, (request_id, logs)
    assert lines[0]["status"] == answer.status_code, lines


@pytest.mark.parametrize(
    ("listener", "case"),
    [("public", case) for case in PUBLIC] + [("operator", case) for case in OPERATOR],
    ids=[name for name, _, _ in PUBLIC + OPERATOR],
)
def test_each_error_answer_carries_an_id_that_names_its_line(
    edge: LiveServer, listener: str, case: tuple[str, int, Send]
) -> None:
    _, status, send = case
    base = edge.base_url if listener == "public" else edge.ops_url
    with httpx.Client(base_url=base, timeout=60.0) as client, capture_logs() as logs:
        answer = send(client, edge)
    assert answer.status_code == status, answer.text
    _assert_named(answer, logs)


def test_the_limiters_429_carries_the_requests_own_id(edge: LiveServer) -> None:
    with httpx.Client(base_url=edge.base_url, timeout=60.0) as client:
        assert client.post(CHAT, json=OK, headers=edge.auth("free")).status_code == 200
        with capture_logs() as logs:
            answer = client.post(CHAT, json=OK, headers=edge.auth("free"))
    assert answer.status_code == 429, answer.text
    _assert_named(answer, logs, prefix="chatcmpl-")


def test_the_stream_gates_refusals_carry_an_id_that_names_their_line(tmp_path: Path) -> None:
    """The free share's 429 (a free request past it, refused once validated), the door's at the cap,
    and the cap's again at the body's end (a request through the door before the cap filled)."""
    upstream = HeldUpstream()

    def provider(settings: Settings, model_dir: Path) -> Any:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            yield [upstream]

        return provide()

    settings = {
        "tiers": ROOMY_TIERS,
        "server": {"max_open_streams": 2},
        "admission": {"reserved_paid_fraction": 0.5},
    }
    late = json.dumps(OK).encode()
    with start_server(tmp_path, settings, provider) as edge, ExitStack() as stack:
        stack.callback(upstream.release)
        client = stack.enter_context(httpx.Client(base_url=edge.base_url, timeout=60.0))
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer {edge.keys['paid']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(late)}\r\nConnection: close\r\n\r\n"
        ).encode()
        free_held = stack.enter_context(client.stream("POST", CHAT, json=HELD, headers=edge.auth("free")))
        assert free_held.status_code == 200, free_held.read()
        free_lines = free_held.iter_lines()  # kept: a dropped iterator closes the response
        next(free_lines)  # its first event: the free share (one stream) is full
        with capture_logs() as logs:
            answer = client.post(CHAT, json=OK, headers=edge.auth("free2"))
        assert answer.status_code == 429 and answer.json()["error"]["code"] == "server_busy", answer.text
        _assert_named(answer, logs)
        sock = stack.enter_context(
            socket.create_connection(("127.0.0.1", edge.settings.server.port), timeout=60)
        )
        sock.sendall(head + late[:5])  # through the door, its body not yet whole
        paid_held = stack.enter_context(client.stream("POST", CHAT, json=HELD, headers=edge.auth("paid")))
        paid_lines = paid_held.iter_lines()
        next(paid_lines)  # the door is full
        with capture_logs() as logs:
            answer = client.post(CHAT, json=OK, headers=edge.auth("paid"))
            sock.sendall(late[5:])
            raw = read_to_close(sock)
    assert answer.status_code == 429 and answer.json()["error"]["code"] == "server_busy", answer.text
    _assert_named(answer, logs)
    raw_head, _, raw_body = raw.partition(b"\r\n\r\n")
    assert raw_head.startswith(b"HTTP/1.1 429 ") and json.loads(raw_body)["error"]["code"] == "server_busy"
    (raw_id,) = [
        line.split(b":", 1)[1].strip().decode()
        for line in raw_head.split(b"\r\n")
        if line.lower().startswith(b"x-request-id:")
    ]
    assert raw_id.startswith("req-") and len(_lines_named(raw_id, logs)) == 1, (raw_id, logs)
