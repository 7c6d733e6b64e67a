"""Bodies built to hurt the edge: nested too deep, too many messages, or never finished.

Regressions (issue 13): deep JSON nesting answered 500 (a RecursionError escaped body parsing);
30,000 empty messages ran the chat template on the event loop for about a second, freezing every
other stream (the off-loop decision counted content characters only); a body shorter than its
Content-Length held its connection with no timeout.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from edge.prompt_encoding import runs_inline
from edge.schemas import MAX_MESSAGES
from edge.text.chat_template import PromptEnd
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, LONG_PROMPT, MODEL, events, find_long_seed
from tests.support.live_server import LiveServer, start_server

BODY_TIMEOUT_S = 0.5
# Default body limit (1 MiB): the 990 KB body of the report must reach the parser.
SETTINGS = {"tiers": ROOMY_TIERS, "server": {"body_timeout_s": BODY_TIMEOUT_S}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("bad-bodies"), SETTINGS) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as c:
        yield c


def _post_raw(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post(CHAT, content=body, headers={"content-type": "application/json"})


# -- nesting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["unknown_field", "content", "messages"])
def test_deep_nesting_is_a_400_error_object(client: httpx.Client, where: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    bodies = {
        "unknown_field": b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"x":%s}',
        "content": b'{"model":"%s","messages":[{"role":"user","content":%s}]}',
        "messages": b'{"model":"%s","messages":%s}',
    }
    body = bodies[where] % (MODEL.encode(), deep)

    answer = _post_raw(client, body)

    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["type"] == "invalid_request_error"


# -- many messages ------------------------------------------------------------------------------


def test_thirty_thousand_empty_messages_are_refused_before_the_template(client: httpx.Client) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": ""}] * 30_000}).encode()
    assert 900_000 < len(body) < 1_048_576  # the report's ~990 KB, under the body limit

    answer = _post_raw(client, body)

    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == "messages" and "2048" in error["message"]


def test_one_message_over_the_cap_is_refused(client: httpx.Client) -> None:
    over = {"model": MODEL, "messages": [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)}
    assert client.post(CHAT, json=over).status_code == 400


def test_many_small_messages_are_encoded_in_a_worker_thread(server: LiveServer, client: httpx.Client) -> None:
    """Under the cap but costly for the template: the work leaves the event loop's thread."""
    # 280 empty messages fit the model's context (~7 tokens each) but cost the template as much as
    # ~18,000 characters of content.
    messages = [{"role": "user", "content": ""}] * 280
    assert not runs_inline(messages)  # content characters alone (0) would have said inline
    text = server.app.state.runtime.pipeline.text
    encode = text.encode_chat
    threads: list[str] = []

    def recording(batch: list[dict[str, str]], scope: str = "", end: PromptEnd = "reply") -> list[int]:
        threads.append(threading.current_thread().name)
        ids: list[int] = encode(batch, scope, end)
        return ids

    text.encode_chat = recording
    try:
        answer = client.post(CHAT, json={"model": MODEL, "messages": messages, "max_tokens": 1})
    finally:
        del text.encode_chat  # the class's method again
    assert answer.status_code == 200, answer.text[:300]
    assert len(threads) == 1
    # The edge's event loop runs in the server's thread (tests/support/live_server.py names it).
    assert not threads[0].startswith("edge-"), threads


def test_a_short_conversation_is_still_encoded_inline() -> None:
    assert runs_inline([{"role": "user", "content": "hi"}] * 8)


# -- bodies that never finish -------------------------------------------------------------------


def _raw_request(server: LiveServer, head_and_body: Callable[[str], bytes]) -> bytes:
    """Send bytes over a plain socket and read until the server closes (bounded by a socket timeout
    far above the body timeout, so a hang fails the test instead of stalling it)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head_and_body(server.keys["paid"]))
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def _short_body(key: str) -> bytes:
    body = b'{"model": "floodgate-tiny", "mess'
    return (
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    ).encode() + body


def test_a_body_shorter_than_its_content_length_gets_408_and_a_closed_connection(
    server: LiveServer,
) -> None:
    received = _raw_request(server, _short_body)  # returns only once the server closed

    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received[:300]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_stream_outlives_the_body_timeout(server: LiveServer, client: httpx.Client) -> None:
    """Only the body has a deadline: a stream's own disconnect watch (the same receive) does not."""
    seed = find_long_seed(client, server.keys["paid"])
    body: dict[str, Any] = {"model": MODEL, "messages": LONG_PROMPT, "seed": seed, "stream": True}
    with client.stream("POST", CHAT, json=body | {"max_tokens": 400}) as stream:
        received = list(events(stream))

    chunks = [e for e in received if isinstance(e, dict)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert received[-1] == DONE


def test_a_client_that_leaves_mid_body_is_a_499_not_a_server_error(server: LiveServer) -> None:
    """Nobody hears the answer, but a 500 there counted in the metrics as the server's fault."""

    def leaves_count() -> float:
        # Summed over every label set: the server is shared, and a hang-up another test caused
        # may be counted under another tier or model.
        total = 0.0
        for line in server.metrics_text().splitlines():
            rejected = line.startswith("floodgate_requests_rejected_total{")
            if rejected and 'code="client_closed_request"' in line:
                assert 'status="499"' in line
                total += float(line.rsplit(" ", 1)[1])
        return total

    before = leaves_count()
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_short_body(server.keys["paid"]))
    deadline = time.monotonic() + 30
    while leaves_count() == before and time.monotonic() < deadline:
        time.sleep(0.05)  # polling an observable counter, bounded
    assert leaves_count() == before + 1
