"""auto_retry sends a request answered with a server error again, as the OpenAI SDK does: a 502 that
says when the restarting replica will serve (Retry-After), a proxy's 504, each within max_retries;
never one the edge marks final (`x-should-retry: false`: the request may be what killed the replica).
Only 429s and 503s were retried: a 502 with its Retry-After raised at once.

A scripted loopback server sends the edge's own 502 (edge/errors.py): a streamed request is answered
200 once admitted, so a real edge gives a stream no 502 at a chosen moment."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from edge.errors import ApiError, ErrorBody, upstream_error
from edge.sse import DONE, ChunkEncoder
from floodgate_client import AsyncClient, Client, FloodgateError
from tests.client.scripted_edge import ScriptedEdge

WAIT_S = 0.2


def answer(error: ApiError) -> bytes:
    """The edge's error answer to a request it did not stream, as a whole HTTP response."""
    body = msgspec.json.encode(ErrorBody(error.detail))
    head = f"HTTP/1.1 {error.status} Error\r\ncontent-type: application/json\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in error.headers.items())
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


RESTARTING_502 = answer(upstream_error(WAIT_S))
FINAL_502 = answer(upstream_error(None, final=True))
# A proxy's page in front of the edge: no Retry-After, so the retry backs off on its own.
PROXY_504 = (
    b"HTTP/1.1 504 Gateway Timeout\r\ncontent-type: text/html\r\ncontent-length: 19\r\n"
    b"connection: close\r\n\r\n<h1>504 Timeout</h1>"
)


def answered(request_id: str) -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return encoder.first() + encoder.delta("hello") + encoder.final("stop", None) + encoder.usage(3, 1) + DONE


def create(kind: str, base_url: str, max_retries: int, auto_retry: bool = True) -> str:
    if kind == "sync":
        with Client(base_url, "fg-test", max_retries=max_retries) as client:
            return client.chat.create("hi", model="floodgate-tiny", auto_retry=auto_retry).text

    async def main() -> str:
        async with AsyncClient(base_url, "fg-test", max_retries=max_retries) as client:
            return (await client.chat.create("hi", model="floodgate-tiny", auto_retry=auto_retry)).text

    return anyio.run(main)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_auto_retry_sends_a_request_answered_502_or_504_again(kind: str) -> None:
    edge = ScriptedEdge([RESTARTING_502, PROXY_504, answered("chatcmpl-third")])
    try:
        assert create(kind, edge.base_url, max_retries=2) == "hello"
        assert edge.requests == 3
    finally:
        edge.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_server_errors_are_retried_max_retries_times_and_a_final_one_never(kind: str) -> None:
    edge = ScriptedEdge([RESTARTING_502])
    try:
        with pytest.raises(FloodgateError) as raised:
            create(kind, edge.base_url, max_retries=2)
        assert edge.requests == 3
        # The last answer's wait, for a caller that retries on its own later.
        assert raised.value.status_code == 502 and raised.value.code == "upstream_error"
        assert raised.value.retry_after_s == pytest.approx(WAIT_S)
    finally:
        edge.close()
    for script, auto_retry in ((FINAL_502, True), (RESTARTING_502, False)):
        edge = ScriptedEdge([script])
        try:
            with pytest.raises(FloodgateError):
                create(kind, edge.base_url, max_retries=2, auto_retry=auto_retry)
            assert edge.requests == 1
        finally:
            edge.close()
