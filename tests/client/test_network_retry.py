"""Network failures: retried once before the answer's head, raised once the stream has opened (a reply
never restarts, nor is charged twice).

A real TCP proxy between client and edge breaks chosen connections (tests/client/flaky_proxy.py).
"""

from __future__ import annotations

import re
import threading
import time
from urllib.parse import urlsplit

import anyio
import httpx
import pytest

from floodgate_client import AsyncClient, Client, NetworkError, RequestStarted, TextDelta
from floodgate_client.errors import transport_failure
from tests.client.live import LONG_REPLY, SURE_TEXT
from tests.client.scripted_edge import ScriptedEdge
from tests.client.test_midstream_overload import QUEUE_FULL_429, answered, overloaded
from tests.edge.sse_client import wait_until
from tests.support.flaky_proxy import flaky_proxy
from tests.support.live_server import LiveServer


def edge_port(server: LiveServer) -> int:
    port = urlsplit(server.base_url).port
    assert port is not None
    return port


def test_a_connection_refused_before_any_answer_is_retried_once(server: LiveServer) -> None:
    with (
        flaky_proxy(edge_port(server), ["refuse"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
    ):
        result = client.chat.create(**SURE_TEXT, model="floodgate-tiny", max_tokens=4)
    assert result.text and proxy.connections >= 2


def test_a_stream_cut_after_its_first_event_raises_and_is_not_sent_again(server: LiveServer) -> None:
    """Cut as it opened, before any text: the edge may have charged it (its prompt, its first tokens),
    so the client raises rather than sending it again under a new id."""
    with (
        flaky_proxy(edge_port(server), ["cut_after_start"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
    ):
        stream = client.chat.stream(**SURE_TEXT, model="floodgate-tiny", max_tokens=4)
        events: list[object] = []
        with pytest.raises(NetworkError, match="stream broken"):
            for event in stream:
                events.append(event)
        stream.close()
    assert len(events) == 1 and isinstance(events[0], RequestStarted)
    assert proxy.connections == 1


def test_a_stream_cut_after_text_arrived_raises_instead_of_restarting(server: LiveServer) -> None:
    with (
        flaky_proxy(edge_port(server), ["cut_after_text"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
    ):
        stream = client.chat.stream(**SURE_TEXT, model="floodgate-tiny", max_tokens=200)
        seen: list[object] = []
        with pytest.raises(NetworkError):
            for event in stream:
                seen.append(event)
        stream.close()
    assert sum(isinstance(event, TextDelta) for event in seen) >= 1
    assert sum(isinstance(event, RequestStarted) for event in seen) == 1
    assert proxy.connections == 1


def _output_tokens(server: LiveServer, who: str) -> int:
    answer = httpx.get(server.base_url + "/v1/usage", headers=server.auth(who), timeout=30.0)
    return sum(int(row["output_tokens"]) for row in answer.json()["data"])


def _paid_requests_finished(server: LiveServer) -> float:
    """The edge's count of the paid tier's requests that have ended, whatever the reason: a request
    is charged (and its usage queued) as it ends, which the client's broken stream need not wait for."""
    pattern = r'^floodgate_requests_finished_total\{[^}]*tier="paid"[^}]*\} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, server.metrics_text(), re.M))


# Greedy, so that the reply with the stop string below comes out as the one without it.
_TOKENS = 24


async def _create_async(base_url: str, key: str, stop: str) -> None:
    async with AsyncClient(base_url, key) as aclient:
        await aclient.chat.create(LONG_REPLY.prompt, temperature=0.0, max_tokens=_TOKENS, stop=stop)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stream_cut_after_tokens_that_carried_no_text_yet_is_not_sent_again(
    server: LiveServer, kind: str
) -> None:
    """The edge holds text back that may be a stop string's start (or a character's first bytes): a
    reply's first tokens can be generated, and charged, with no text sent yet. Here a stop string
    that the whole greedy reply begins holds all of it back to the end, and the connection is cut
    just before that text: the reply was generated and charged in full. The client took "no text
    yet" for "no reply yet" and sent the request again: generated and charged twice."""
    key = server.keys["paid"]
    with Client(server.base_url, key) as client:
        text = client.chat.create(LONG_REPLY.prompt, temperature=0.0, max_tokens=_TOKENS).text
    stop = text + "\u2603"
    before = _output_tokens(server, "paid")
    finished = _paid_requests_finished(server)
    with flaky_proxy(edge_port(server), ["cut_before_text"]) as proxy, pytest.raises(NetworkError):
        if kind == "sync":
            with Client(proxy.base_url, key) as client:
                client.chat.create(LONG_REPLY.prompt, temperature=0.0, max_tokens=_TOKENS, stop=stop)
        else:
            anyio.run(_create_async, proxy.base_url, key, stop)
    assert proxy.connections == 1
    wait_until(lambda: _paid_requests_finished(server) > finished, 30.0, "the cut request's end on the edge")
    assert _output_tokens(server, "paid") - before == _TOKENS


def test_a_stream_with_a_conversation_id_is_not_reopened(server: LiveServer) -> None:
    """The edge may have stored the first request's turn already: a reopen would store it twice."""
    with (
        flaky_proxy(edge_port(server), ["cut_after_start"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
    ):
        stream = client.chat.stream("hi", model="floodgate-tiny", max_tokens=4, conversation_id="conv-cut")
        with pytest.raises(NetworkError):
            list(stream)
        # Counted before a `with` exit would send its cancel on a connection of its own.
        assert proxy.connections == 1
        stream.close()


@pytest.mark.anyio
async def test_an_async_stream_with_a_conversation_id_is_not_reopened(server: LiveServer) -> None:
    with flaky_proxy(edge_port(server), ["cut_after_start"]) as proxy:
        async with AsyncClient(proxy.base_url, server.keys["paid"]) as client:
            stream = await client.chat.stream(
                "hi", model="floodgate-tiny", max_tokens=4, conversation_id="conv-cut-async"
            )
            with pytest.raises(NetworkError):
                async for _ in stream:
                    pass
            assert proxy.connections == 1
            await stream.close()


def test_too_many_network_failures_raise_network_error(server: LiveServer) -> None:
    with (
        flaky_proxy(edge_port(server), ["refuse", "refuse"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
        pytest.raises(NetworkError),
    ):
        client.chat.stream("hi", model="floodgate-tiny", max_tokens=4)
    assert proxy.connections == 2


@pytest.mark.anyio
async def test_an_async_stream_cut_after_its_first_event_raises_and_is_not_sent_again(
    server: LiveServer,
) -> None:
    with flaky_proxy(edge_port(server), ["cut_after_start"]) as proxy:
        async with AsyncClient(proxy.base_url, server.keys["paid"]) as client:
            with pytest.raises(NetworkError, match="stream broken"):
                await client.chat.create(**SURE_TEXT, model="floodgate-tiny", max_tokens=4)
    assert proxy.connections == 1


def test_a_reset_stream_says_what_happened_in_the_sync_and_the_async_client(server: LiveServer) -> None:
    """anyio's errors carry no message (httpx's ReadError('') over a reset): the NetworkError must
    still say what happened, as the sync client's does, for the log line or the UI that shows it."""
    plans = ["reset_after_text"] * 2
    with (
        flaky_proxy(edge_port(server), plans) as proxy,
        Client(proxy.base_url, server.keys["paid"], max_retries=0) as client,
        pytest.raises(NetworkError) as sync_caught,
    ):
        client.chat.create(**SURE_TEXT, model="floodgate-tiny", max_tokens=200)

    async def main() -> None:
        async with AsyncClient(proxy.base_url, server.keys["paid"], max_retries=0) as aclient:
            await aclient.chat.create(**SURE_TEXT, model="floodgate-tiny", max_tokens=200)

    with flaky_proxy(edge_port(server), plans) as proxy, pytest.raises(NetworkError) as async_caught:
        anyio.run(main)
    for caught in (sync_caught, async_caught):
        what, _, happened = str(caught.value).partition(": ")
        assert what == "stream broken" and "reset" in happened.lower(), str(caught.value)


def test_a_timeout_with_an_empty_message_still_says_it_timed_out() -> None:
    """What the async client gets for a read timeout: ReadTimeout(''), over anyio's TimeoutError()."""
    assert str(transport_failure("stream broken", httpx.ReadTimeout(""))) == "stream broken: timed out"
    assert str(transport_failure("request failed", httpx.ReadError(""))) == "request failed: ReadError"


def test_a_request_with_a_conversation_id_is_not_sent_again_after_a_network_failure(
    server: LiveServer,
) -> None:
    """The edge may have stored the turn of a request it never answered (behind a proxy that buffers,
    it can): sending it again would store the question twice. Sent twice before (a dropped
    connection before the answer's head went through the open's own retry)."""
    with (
        flaky_proxy(edge_port(server), ["refuse"]) as proxy,
        Client(proxy.base_url, server.keys["paid"]) as client,
        pytest.raises(NetworkError),
    ):
        client.chat.create(**SURE_TEXT, model="floodgate-tiny", max_tokens=4, conversation_id="trip")
    assert proxy.connections == 1


def _read_after_close(base_url: str) -> None:
    with Client(base_url, "fg-test") as client:
        stream = client.chat.stream("hi", model="floodgate-tiny")
        assert isinstance(next(stream), RequestStarted)
        stream.close()
        list(stream)


async def _read_after_close_async(base_url: str) -> None:
    async with AsyncClient(base_url, "fg-test") as client:
        stream = await client.chat.stream("hi", model="floodgate-tiny")
        assert isinstance(await anext(aiter(stream)), RequestStarted)
        await stream.close()
        async for _ in stream:
            pass


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_closed_stream_is_never_reopened(kind: str) -> None:
    """Iterating on after close() (or a reader beside a cancel that failed and closed it) read the
    closed connection as a network failure before any text, and sent the request again: a new
    generation the caller never asked for. Now it raises; the edge saw one request."""
    edge = ScriptedEdge([answered("chatcmpl-only")], hold_open=threading.Event())
    try:
        with pytest.raises(NetworkError, match="stream closed"):
            if kind == "sync":
                _read_after_close(edge.base_url)
            else:
                anyio.run(_read_after_close_async, edge.base_url)
        assert edge.requests == 1
    finally:
        assert edge.hold_open is not None
        edge.hold_open.set()
        edge.close()


def test_a_stream_closed_while_its_retry_waits_sends_nothing_more() -> None:
    """Refused in the stream, then a 429 on the reopen: the close() from another thread comes while
    the 429's wait runs, and the wait used to end in one more request, read in full."""
    edge = ScriptedEdge([overloaded("chatcmpl-first"), QUEUE_FULL_429, answered("chatcmpl-third")])
    try:
        with Client(edge.base_url, "fg-test", max_retries=5) as client:
            stream = client.chat.stream("hi", model="floodgate-tiny", auto_retry=True)

            def close_once_refused_twice() -> None:
                deadline = time.monotonic() + 30
                while edge.requests < 2 and time.monotonic() < deadline:
                    time.sleep(0.005)  # the scripted edge's count: a poll, not a wait on timing
                stream.close()

            closer = threading.Thread(target=close_once_refused_twice)
            closer.start()
            with pytest.raises(NetworkError, match="stream closed"):
                list(stream)
            closer.join()
        assert edge.requests == 2
    finally:
        edge.close()


def test_an_async_stream_closed_before_it_was_opened_is_never_sent() -> None:
    edge = ScriptedEdge([answered("chatcmpl-only")])

    async def main() -> None:
        async with AsyncClient(edge.base_url, "fg-test") as client:
            stream = client.chat.stream("hi", model="floodgate-tiny")
            await stream.close()
            async for _ in stream:
                pass

    try:
        with pytest.raises(NetworkError, match="stream closed"):
            anyio.run(main)
        assert edge.requests == 0
    finally:
        edge.close()
