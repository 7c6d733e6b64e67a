"""A reply cut once its stream had opened raises NetworkError, and the edge has charged it (and, with a
conversation_id, stored its turn under its id). The error names that request, as an error answer's does
(`request_id`, from x-request-id): raised out of `create()`, whose stream the caller never holds, it was
None, and nothing tied the failure to the edge's log line, the stored turn or a support ticket.

A real TCP proxy (tests/support/flaky_proxy.py) cuts the edge's stream after its first text."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import anyio
import httpx
import pytest

from floodgate_client import AsyncClient, Client, NetworkError
from tests.client.live import LONG_REPLY
from tests.support.flaky_proxy import flaky_proxy
from tests.support.live_server import LiveServer


def _stored_request_id(server: LiveServer, conversation_id: str) -> str:
    """The request id the edge stored the conversation's (only) question under."""
    answer = httpx.get(
        f"{server.base_url}/v1/conversations/{conversation_id}/messages",
        headers=server.auth("paid"),
        timeout=30.0,
    )
    questions = [m for m in answer.json()["data"] if m["role"] == "user"]
    assert len(questions) == 1
    request_id: str = questions[0]["request_id"]
    return request_id


def _edge_port(server: LiveServer) -> int:
    port = urlsplit(server.base_url).port
    assert port is not None
    return port


def test_a_reply_cut_under_create_raises_naming_its_request(server: LiveServer) -> None:
    conversation_id = f"cut-{uuid.uuid4().hex}"
    with (
        flaky_proxy(_edge_port(server), ["cut_after_text"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
        pytest.raises(NetworkError) as raised,
    ):
        client.chat.create(
            LONG_REPLY.prompt, temperature=0.0, max_tokens=200, conversation_id=conversation_id
        )
    assert raised.value.request_id is not None
    assert raised.value.request_id == _stored_request_id(server, conversation_id)


def test_an_async_reply_cut_under_create_raises_naming_its_request(server: LiveServer) -> None:
    conversation_id = f"cut-{uuid.uuid4().hex}"

    async def main() -> NetworkError:
        with flaky_proxy(_edge_port(server), ["cut_after_text"]) as proxy:
            async with AsyncClient(proxy.base_url, server.keys["paid"]) as client:
                with pytest.raises(NetworkError) as raised:
                    await client.chat.create(
                        LONG_REPLY.prompt, temperature=0.0, max_tokens=200, conversation_id=conversation_id
                    )
        return raised.value

    error = anyio.run(main)
    assert error.request_id is not None
    assert error.request_id == _stored_request_id(server, conversation_id)


def test_reading_on_after_the_cut_names_the_request_too(server: LiveServer) -> None:
    with (
        flaky_proxy(_edge_port(server), ["cut_after_text"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
        client.chat.stream(LONG_REPLY.prompt, temperature=0.0, max_tokens=200) as stream,
    ):
        with pytest.raises(NetworkError) as cut:
            stream.until_finished()
        with pytest.raises(NetworkError) as again:
            next(stream)
    assert cut.value.request_id == again.value.request_id == stream.request_id != None  # noqa: E711
