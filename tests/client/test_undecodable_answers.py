"""Answers whose content-encoding is broken (a proxy's gzip garbage): httpx's DecodingError is no
transport error, and escaped every call, past every `except FloodgateError` (the CLI's: a traceback).
A stream raises StreamError, as for a malformed chunk, and is not sent again: its body is no network
failure to retry blindly. An error answer or a cancel's answer raises the error its status and
headers say, as one whose body was cut off does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from floodgate_client import AsyncClient, Client, ConflictError, RateLimitError, StreamError
from tests.client.scripted_edge import ScriptedEdge
from tests.client.test_midstream_overload import answered

_GARBLED_STREAM = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
    b"x-request-id: chatcmpl-garbled\r\nconnection: close\r\n\r\nthis is not gzip"
)
_GARBLED_429 = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
    b"retry-after: 30\r\nx-request-id: req-garbled\r\ncontent-length: 16\r\nconnection: close\r\n\r\n"
    b"this is not gzip"
)
_GARBLED_409 = (
    b"HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
    b"content-length: 16\r\nconnection: close\r\n\r\nthis is not gzip"
)


def _caught(
    kind: str,
    base_url: str,
    call: Callable[[Client], object],
    acall: Callable[[AsyncClient], Awaitable[object]],
) -> Exception:
    """What `call` (sync) or `acall` (async) raised: whichever it is, the point of each test."""
    caught: list[Exception] = []

    async def run_async() -> None:
        async with AsyncClient(base_url, "fg-test") as aclient:
            try:
                await acall(aclient)
            except Exception as error:
                caught.append(error)

    if kind == "sync":
        with Client(base_url, "fg-test") as client:
            try:
                call(client)
            except Exception as error:
                caught.append(error)
    else:
        anyio.run(run_async)
    [error] = caught
    return error


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stream_whose_body_cannot_be_decoded_raises_stream_error_and_is_not_sent_again(kind: str) -> None:
    edge = ScriptedEdge([_GARBLED_STREAM, answered("chatcmpl-second")])

    async def acreate(aclient: AsyncClient) -> object:
        return await aclient.chat.create("hi", model="floodgate-tiny")

    try:
        error = _caught(kind, edge.base_url, lambda c: c.chat.create("hi", model="floodgate-tiny"), acreate)
        assert isinstance(error, StreamError), repr(error)
        assert error.request_id == "chatcmpl-garbled"
        assert edge.requests == 1
    finally:
        edge.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_answer_whose_body_cannot_be_decoded_raises_its_typed_error(kind: str) -> None:
    edge = ScriptedEdge([_GARBLED_429])

    async def astream(aclient: AsyncClient) -> object:
        return await aclient.chat.stream("hi", model="floodgate-tiny")

    try:
        error = _caught(kind, edge.base_url, lambda c: c.chat.stream("hi", model="floodgate-tiny"), astream)
        assert isinstance(error, RateLimitError), repr(error)
        assert error.status_code == 429 and error.retry_after_s == 30.0
        assert error.request_id == "req-garbled"
    finally:
        edge.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_cancel_answer_that_cannot_be_decoded_raises_its_typed_error(kind: str) -> None:
    edge = ScriptedEdge([answered("chatcmpl-a")], cancel_answer=_GARBLED_409)

    async def acancel(aclient: AsyncClient) -> object:
        return await aclient.chat.cancel("chatcmpl-a")

    try:
        error = _caught(kind, edge.base_url, lambda c: c.chat.cancel("chatcmpl-a"), acancel)
        assert isinstance(error, ConflictError), repr(error)
    finally:
        edge.close()
