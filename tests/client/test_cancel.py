"""Cancelling: the server stops the generation and says so, from the stream, the side, or a `with` exit.

Each test stops a reply that the demo model makes long (tests/client/live.py); should one end on its
own before the cancel lands, the next recipe is tried, so a finished reply never passes for a cancel.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import anyio
import pytest

from edge.sse import ChunkEncoder
from floodgate_client import (
    AsyncClient,
    Client,
    ConflictError,
    Finished,
    FloodgateError,
    NetworkError,
    TextDelta,
)
from floodgate_client.async_client import AsyncChat, AsyncChatStream
from floodgate_client.client import CANCEL_DRAIN_S, CANCEL_ON_EXIT_S, Chat, ChatStream
from tests.client.live import LONG_REPLIES, LONG_REPLY, LONG_REPLY_TOKENS, LongReply
from tests.client.scripted_edge import ScriptedEdge
from tests.client.test_midstream_overload import answered
from tests.edge.sse_client import wait_until
from tests.support.live_server import LiveServer

ROOT = Path(__file__).resolve().parents[2]


def open_long(client: Client, recipe: LongReply) -> ChatStream:
    """A long reply's stream, read up to its first text."""
    stream = client.chat.stream(
        recipe.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=recipe.temperature, seed=recipe.seed
    )
    next(event for event in stream if isinstance(event, TextDelta))
    return stream


def stop_a_long_reply(client: Client, stop: Callable[[ChatStream], bool]) -> ChatStream:
    """Open long replies until `stop` lands on one still running (it returns False when too late)."""
    for recipe in LONG_REPLIES:
        stream = open_long(client, recipe)
        if stop(stream):
            return stream
        stream.close()
    raise AssertionError("every long reply finished before it could be stopped")


def ends_with_the_servers_cancelled_ending(events: list[object]) -> None:
    """What a stream gives after its cancel() was confirmed: the text the server sent before the cancel
    reached it, if any, then the server's own final chunk, with the usage it sends after a cancel."""
    *text, finished = events
    assert all(isinstance(event, TextDelta) for event in text), events
    assert isinstance(finished, Finished) and finished.cancelled and finished.reason == "stop", events
    assert finished.usage is not None, "the server's usage, sent after the cancel, was not read"
    assert 0 < finished.usage.completion_tokens < LONG_REPLY_TOKENS


def test_cancel_is_confirmed_and_the_stream_ends_cancelled_with_the_servers_usage(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        stream = stop_a_long_reply(client, lambda stream: stream.cancel())
        ends_with_the_servers_cancelled_ending(list(stream))
        assert stream.finished is not None and stream.finished.cancelled
        assert stream.request_id is not None
        # A cancel repeated (a client retrying after a lost answer) is answered as the first was,
        # as OpenAI's cancel of a cancelled response is: idempotent.
        assert client.chat.cancel(stream.request_id) == "CANCELLED"


def test_a_cancel_from_the_side_ends_the_stream_with_the_servers_cancelled_marker(server: LiveServer) -> None:
    def cancel_from_the_side(stream: ChatStream) -> bool:
        assert stream.request_id is not None
        try:
            return client.chat.cancel(stream.request_id) == "CANCELLED"
        except ConflictError:
            return False

    with Client(server.base_url, server.keys["paid"]) as client:
        stream = stop_a_long_reply(client, cancel_from_the_side)
        finished = stream.until_finished()
    # This Finished is the edge's own final chunk: the stream was read to its [DONE].
    assert finished.cancelled and finished.reason == "stop"
    assert finished.usage is not None and finished.usage.completion_tokens < LONG_REPLY_TOKENS


def test_leaving_the_with_block_early_cancels_on_the_server(server: LiveServer) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        with open_long(client, LONG_REPLIES[0]) as stream:
            request_id = stream.request_id
        assert request_id is not None and stream.text
        # Cancelled on exit, so no longer running: the server has it as finished.
        with pytest.raises(ConflictError):
            client.chat.cancel(request_id)


def test_leaving_the_with_block_early_is_prompt_with_every_pool_connection_taken(server: LiveServer) -> None:
    """httpx's pool holds 100 connections; each open stream holds one. The exit must not wait the
    whole timeout (60 s) for a slot its own stream holds."""
    with Client(server.base_url, server.keys["paid"]) as client, ExitStack() as others:
        for _ in range(99):
            others.enter_context(client.chat.stream("hi", max_tokens=1))
        with open_long(client, LONG_REPLIES[0]) as stream:
            request_id = stream.request_id
            started = time.monotonic()
        assert time.monotonic() - started < 15.0
        assert request_id is not None
        # Stopped on the server (by the disconnect, or the cancel after it).
        with pytest.raises(ConflictError):
            client.chat.cancel(request_id)


@pytest.mark.anyio
async def test_async_with_exit_cancels_and_async_cancel_is_confirmed(server: LiveServer) -> None:
    recipe = LONG_REPLIES[0]

    async def open_long_async(client: AsyncClient) -> AsyncChatStream:
        stream = await client.chat.stream(
            recipe.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=recipe.temperature, seed=recipe.seed
        )
        async for event in stream:
            if isinstance(event, TextDelta):
                break
        return stream

    async with AsyncClient(server.base_url, server.keys["paid"]) as client:
        async with await open_long_async(client) as stream:
            request_id = stream.request_id
        assert request_id is not None
        with pytest.raises(ConflictError):
            await client.chat.cancel(request_id)

        stream = await open_long_async(client)
        assert await stream.cancel() is True
        ends_with_the_servers_cancelled_ending([event async for event in stream])
        await stream.close()


@pytest.mark.anyio
async def test_leaving_an_async_with_block_early_is_prompt_with_every_pool_connection_taken(
    server: LiveServer,
) -> None:
    """The async exit sent its cancel before closing its own connection: with the pool's only
    connection taken by that stream, the cancel waited out its whole bound (5 s) while the reply
    generated on (a review, max_connections 1 and 3)."""
    recipe = LONG_REPLIES[0]
    async with AsyncClient(server.base_url, server.keys["paid"], max_connections=1) as client:
        stream = await client.chat.stream(
            recipe.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=recipe.temperature, seed=recipe.seed
        )
        async with stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    break
            request_id = stream.request_id
            started = time.monotonic()
        assert time.monotonic() - started < CANCEL_ON_EXIT_S
        assert request_id is not None
        # Stopped on the server (by the disconnect, or the cancel after it).
        with pytest.raises(ConflictError):
            await client.chat.cancel(request_id)


def test_a_cancel_from_another_thread_ends_the_readers_stream_cleanly(server: LiveServer) -> None:
    events: list[object] = []
    first_text = threading.Event()

    def read(stream: ChatStream) -> None:
        for event in stream:
            events.append(event)
            if isinstance(event, TextDelta):
                first_text.set()

    with Client(server.base_url, server.keys["paid"]) as client:
        stream = client.chat.stream(
            LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=LONG_REPLY.temperature
        )
        reader = threading.Thread(target=read, args=(stream,))
        reader.start()
        assert first_text.wait(timeout=30)
        assert stream.cancel() is True
        reader.join(timeout=30)
    assert not reader.is_alive()
    last = events[-1]
    assert isinstance(last, Finished) and last.cancelled and last.usage is not None
    assert sum(isinstance(event, Finished) for event in events) == 1


async def _cancel_from_another_task(stream: AsyncChatStream, within_s: float) -> list[object]:
    """Read `stream` in one task and cancel it from another once its first text came; what the
    reader got, to the end."""
    events: list[object] = []
    first_text = anyio.Event()

    async def read() -> None:
        async for event in stream:
            events.append(event)
            if isinstance(event, TextDelta):
                first_text.set()

    with anyio.fail_after(within_s):
        async with anyio.create_task_group() as group:
            group.start_soon(read)
            await first_text.wait()
            assert await stream.cancel() is True
    return events


@pytest.mark.anyio
async def test_a_cancel_from_another_task_ends_the_readers_stream_cleanly(server: LiveServer) -> None:
    async with AsyncClient(server.base_url, server.keys["paid"]) as client:
        stream = await client.chat.stream(
            LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=LONG_REPLY.temperature
        )
        events = await _cancel_from_another_task(stream, 30)
    last = events[-1]
    assert isinstance(last, Finished) and last.cancelled and last.usage is not None
    assert sum(isinstance(event, Finished) for event in events) == 1


PROXY_PAGE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 23\r\nconnection: close\r\n\r\n"
    b"<html>maintenance</html>"
)


def test_a_cancel_answered_with_a_proxys_page_raises_floodgate_error_and_a_with_exit_swallows_it() -> None:
    """A 200 that is not the edge's JSON (a proxy or captive portal in the way) is an error the caller
    handles like any other; leaving a `with` block never raises it (the disconnect stops the reply)."""
    edge = ScriptedEdge([answered("chatcmpl-a")], cancel_answer=PROXY_PAGE)
    try:
        with Client(edge.base_url, "fg-test") as client:
            with pytest.raises(FloodgateError) as raised:
                client.chat.cancel("chatcmpl-a")
            assert raised.value.status_code == 200 and "maintenance" in raised.value.message
            with client.chat.stream("hi", model="floodgate-tiny") as stream:
                next(event for event in stream if isinstance(event, TextDelta))
        assert edge.cancels == 2

        async def leave_async() -> None:
            async with AsyncClient(edge.base_url, "fg-test") as aclient:
                with pytest.raises(FloodgateError):
                    await aclient.chat.cancel("chatcmpl-a")
                async with aclient.chat.stream("hi", model="floodgate-tiny") as astream:
                    async for event in astream:
                        if isinstance(event, TextDelta):
                            break

        anyio.run(leave_async)
        assert edge.cancels == 4
    finally:
        edge.close()


CANCELLED = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 22\r\n\r\n{"status":"CANCELLED"}'
)


def text_then_silence(request_id: str) -> bytes:
    encoder = ChunkEncoder(request_id, "floodgate-tiny", 0)
    return encoder.first() + encoder.delta("hello")


def test_a_confirmed_cancel_whose_stream_then_goes_silent_ends_within_its_bound() -> None:
    """The server confirms the cancel, then sends nothing more and keeps the connection open (a proxy
    holding the rest back, a peer gone): reading on must end within CANCEL_DRAIN_S, cancelled, without
    usage, however long the client's read timeout; from this thread or a reader's."""
    hold = threading.Event()
    edge = ScriptedEdge([text_then_silence("chatcmpl-quiet")], cancel_answer=CANCELLED, hold_open=hold)
    try:
        with Client(edge.base_url, "fg-test", timeout=60.0) as client:
            with client.chat.stream("hi", model="floodgate-tiny") as stream:
                next(event for event in stream if isinstance(event, TextDelta))
                started = time.monotonic()
                assert stream.cancel() is True
                assert list(stream) == [Finished("stop", None, cancelled=True)]
                assert time.monotonic() - started < CANCEL_DRAIN_S + 5.0

        async def read_in_a_task_cancel_in_another() -> list[object]:
            async with AsyncClient(edge.base_url, "fg-test", timeout=60.0) as aclient:
                async with aclient.chat.stream("hi", model="floodgate-tiny") as astream:
                    return await _cancel_from_another_task(astream, CANCEL_DRAIN_S + 5.0)

        events = anyio.run(read_in_a_task_cancel_in_another)
        assert events[-1] == Finished("stop", None, cancelled=True)
        assert edge.cancels == 2
    finally:
        hold.set()
        edge.close()


def test_a_stream_that_timed_out_sends_no_cancel_on_exit() -> None:
    """The edge went silent mid-reply and the read timed out: the block's exit closes the connection
    (which the edge sees, and stops the generation) and sends no cancel, which would wait up to
    CANCEL_ON_EXIT_S more on the peer that just failed to answer; sync and async alike."""
    hold = threading.Event()
    edge = ScriptedEdge([text_then_silence("chatcmpl-quiet")], hold_open=hold)
    try:
        with Client(edge.base_url, "fg-test", timeout=0.3) as client, pytest.raises(NetworkError):
            with client.chat.stream("hi", model="floodgate-tiny") as stream:
                list(stream)

        async def read_async() -> None:
            async with AsyncClient(edge.base_url, "fg-test", timeout=0.3) as aclient:
                async with aclient.chat.stream("hi", model="floodgate-tiny") as astream:
                    async for _ in astream:
                        pass

        with pytest.raises(NetworkError):
            anyio.run(read_async)
        assert (edge.requests, edge.cancels) == (2, 0)
    finally:
        hold.set()
        edge.close()


def test_leaving_the_with_block_while_another_thread_reads_cancels_and_ends_its_read(
    server: LiveServer,
) -> None:
    """A reader thread (a GUI's, say) beside a block its owner leaves: the exit raised ValueError
    ("generator already executing") and neither closed the connection nor sent the cancel, so the
    generation ran on and the reader sat in its read until the timeout."""
    failed: list[BaseException] = []
    first_text = threading.Event()

    def read(stream: ChatStream) -> None:
        try:
            for event in stream:
                if isinstance(event, TextDelta):
                    first_text.set()
        except FloodgateError as error:
            failed.append(error)

    with Client(server.base_url, server.keys["paid"]) as client:
        stream = client.chat.stream(
            LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=LONG_REPLY.temperature
        )
        reader = threading.Thread(target=read, args=(stream,), daemon=True)
        with stream:
            reader.start()
            assert first_text.wait(timeout=30)
            request_id = stream.request_id
        reader.join(timeout=CANCEL_ON_EXIT_S)  # its read ends as the connection is shut
        assert not reader.is_alive()
        assert [type(error) for error in failed] == [NetworkError], failed
        assert request_id is not None
        with pytest.raises(ConflictError):  # stopped on the server
            client.chat.cancel(request_id)


@pytest.mark.anyio
async def test_leaving_an_async_with_block_while_another_task_reads_cancels_and_ends_its_read(
    server: LiveServer,
) -> None:
    """As the sync one: aclose() of the stream's generator, running in the reader's task, raised
    RuntimeError, and the exit neither closed the connection nor sent the cancel."""
    failed: list[BaseException] = []
    first_text = anyio.Event()

    async def read(stream: AsyncChatStream) -> None:
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    first_text.set()
        except FloodgateError as error:
            failed.append(error)

    async with AsyncClient(server.base_url, server.keys["paid"]) as client:
        stream = await client.chat.stream(
            LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=LONG_REPLY.temperature
        )
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                async with stream:
                    group.start_soon(read, stream)
                    await first_text.wait()
                    request_id = stream.request_id
        assert [type(error) for error in failed] == [NetworkError], failed
        assert request_id is not None
        with pytest.raises(ConflictError):  # stopped on the server
            await client.chat.cancel(request_id)


def test_a_close_from_another_thread_always_ends_the_readers_read(server: LiveServer) -> None:
    """close() shut the reader's socket down and then closed it under the read: the socket's number
    was at times taken at once by this thread's next connection, and the read waited on that one
    to its timeout (4 runs in 150 of this loop; the chance that a loop this long missed it is
    about 2%). Each reader must end as soon as its stream is closed."""
    hung = 0
    with Client(server.base_url, server.keys["paid"], timeout=3.0) as client:
        for _ in range(150):
            first_text = threading.Event()
            stream = client.chat.stream(
                LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=LONG_REPLY.temperature
            )

            def read(stream: ChatStream = stream, first_text: threading.Event = first_text) -> None:
                with contextlib.suppress(FloodgateError):
                    for event in stream:
                        if isinstance(event, TextDelta):
                            first_text.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            assert first_text.wait(timeout=30)
            stream.close()
            client.chat.create("hi", max_tokens=1)  # the next request, on a new connection
            reader.join(timeout=2.0)  # well within the read timeout (3 s)
            hung += reader.is_alive()
            reader.join()
    assert hung == 0


def _open_streams(server: LiveServer) -> float:
    (line,) = (
        line for line in server.metrics_text().splitlines() if line.startswith("floodgate_open_streams ")
    )
    return float(line.split()[1])


def test_a_stream_dropped_unread_and_unclosed_stops_its_generation(server: LiveServer) -> None:
    """A stream opened and never read nor closed (no `with`), then dropped: its connection stayed
    checked out of the pool, open, and the edge went on with the generation (billed) for as long as
    the client lived; a cancel of its id long after answered CANCELLED. Collected, it hangs up."""
    baseline = _open_streams(server)
    with Client(server.base_url, server.keys["paid"]) as client:
        stream = client.chat.stream(LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=0.0)
        request_id = stream.request_id
        assert request_id is not None
        del stream
        gc.collect()
        wait_until(lambda: _open_streams(server) <= baseline, 30.0, "the edge to stop the dropped reply")
        with pytest.raises(ConflictError):
            client.chat.cancel(request_id)
        pool = client._http._transport._pool  # type: ignore[attr-defined]
        wait_until(
            lambda: not pool.connections or all(c.is_idle() for c in pool.connections), 30.0, "the pool slot"
        )


def test_an_async_stream_dropped_unread_and_unclosed_stops_its_generation(server: LiveServer) -> None:
    baseline = _open_streams(server)

    async def main() -> None:
        async with AsyncClient(server.base_url, server.keys["paid"]) as client:
            stream = await client.chat.stream(
                LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=0.0
            )
            request_id = stream.request_id
            assert request_id is not None
            del stream
            gc.collect()
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: _open_streams(server) <= baseline, 30.0, "the edge to stop it")
            )
            with pytest.raises(ConflictError):
                await client.chat.cancel(request_id)
            # Its connection back in the pool too (it stayed checked out, one slot a dropped
            # stream, until none was left and every request waited for a PoolTimeout).
            pool = client._http._transport._pool  # type: ignore[attr-defined]
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: not pool.connections or all(c.is_idle() for c in pool.connections),
                    30.0,
                    "its connection back in the pool",
                )
            )

    anyio.run(main)


_EXITS_WITH_A_STREAM_UNREAD = """
from floodgate_client import Client
from tests.client.scripted_edge import ScriptedEdge

edge = ScriptedEdge([b""], watch_hangup=True)
client = Client(edge.base_url, "fg-test")
stream = client.chat.stream("hi")  # never read: collected as the interpreter shuts down
print("opened", flush=True)
"""


def test_a_program_that_exits_with_a_stream_unread_exits() -> None:
    """A script (or one that raised) leaving a stream opened and unread in a global: collected as
    the interpreter shut down, its __del__ started a thread to close the response, which never ran
    there, and waited for it forever: the program hung at exit."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _EXITS_WITH_A_STREAM_UNREAD],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "client"), str(ROOT)])},
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the program hung at its exit")
    assert done.returncode == 0 and "opened" in done.stdout, done.stderr[-2000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_cancel_bounded_by_timeout_s_raises_network_error_in_both_clients(kind: str) -> None:
    """The async chat.cancel took no timeout_s, where the sync one does: a caller bounding a cancel
    (a shutdown, a UI's stop button) could only wrap it in a scope of its own. Both take it now, the
    same way: past it, NetworkError."""
    hold = threading.Event()  # the cancel is never answered while the test runs
    edge = ScriptedEdge([answered("chatcmpl-a")], hold_cancel=hold)

    async def cancel_async() -> None:
        async with AsyncClient(edge.base_url, "fg-test", timeout=60.0) as aclient:
            await aclient.chat.cancel("chatcmpl-a", timeout_s=0.2)

    try:
        with pytest.raises(NetworkError, match="timed out"):
            if kind == "sync":
                with Client(edge.base_url, "fg-test", timeout=60.0) as client:
                    client.chat.cancel("chatcmpl-a", timeout_s=0.2)
            else:
                anyio.run(cancel_async)
        assert edge.cancels == 1
    finally:
        hold.set()
        edge.close()


def test_the_sync_and_async_clients_calls_take_the_same_parameters() -> None:
    for name in ("stream", "create", "cancel"):
        sync_parameters = inspect.signature(getattr(Chat, name)).parameters
        async_parameters = inspect.signature(getattr(AsyncChat, name)).parameters
        assert list(sync_parameters.values()) == list(async_parameters.values()), name
