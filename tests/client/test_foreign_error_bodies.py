"""An error answer whose JSON is no OpenAI error object (a gateway or proxy in front of the edge: AWS
API Gateway's `{"message": ...}`, a framework's `{"detail": ...}`, `{"error": "..."}`) keeps its words
in the error's message, as a page that is not JSON does: it said only "unknown error", its status
the one clue left (the OpenAI SDK keeps such a body, in its message or its `body`)."""

from __future__ import annotations

import anyio
import pytest

from floodgate_client import AsyncClient, Client, FloodgateError, NotFoundError
from tests.client.scripted_edge import ScriptedEdge


def _answer(status: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


_FOREIGN = [
    ("502 Bad Gateway", b'{"message": "Internal server error"}', "Internal server error"),
    ("404 Not Found", b'{"detail": "No route for /v1/chat/completions"}', "No route for"),
    ("404 Not Found", b'{"error": "model \'tiny\' not found"}', "model 'tiny' not found"),
]


@pytest.mark.parametrize(("status", "body", "said"), _FOREIGN)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_answer_of_another_shape_keeps_its_words(
    kind: str, status: str, body: bytes, said: str
) -> None:
    edge = ScriptedEdge([_answer(status, body)])
    caught: list[FloodgateError] = []

    async def run_async() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as aclient:
            try:
                await aclient.chat.create("hi")
            except FloodgateError as error:
                caught.append(error)

    if kind == "sync":
        with Client(edge.base_url, "fg-test") as client, pytest.raises(FloodgateError) as raised:
            client.chat.create("hi")
        caught.append(raised.value)
    else:
        anyio.run(run_async)
    [error] = caught
    assert error.status_code == int(status.split()[0])
    assert said in error.message


def test_a_cancel_answered_in_another_shape_keeps_its_words() -> None:
    edge = ScriptedEdge([b""], cancel_answer=_answer("404 Not Found", b'{"detail": "no such request"}'))
    with Client(edge.base_url, "fg-test") as client, pytest.raises(NotFoundError) as raised:
        client.chat.cancel("chatcmpl-x")
    assert "no such request" in raised.value.message


def test_an_openai_error_object_still_gives_its_own_message() -> None:
    body = b'{"error": {"message": "Rate limit reached.", "type": "requests", "code": "rate_limit_exceeded"}}'
    edge = ScriptedEdge([_answer("400 Bad Request", body)])
    with Client(edge.base_url, "fg-test") as client, pytest.raises(FloodgateError) as raised:
        client.chat.create("hi")
    assert raised.value.message == "Rate limit reached." and raised.value.code == "rate_limit_exceeded"
