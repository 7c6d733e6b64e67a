"""Running a generation as an ASGI response while watching the client's connection.

Litestar's own Stream response cancels its iterator on disconnect but may leave it un-closed, and
a generation must release its slot, settle its lease and abort the engine sequence at once. So the
request runs the generation itself, cancelled when the client goes (edge/disconnect_watch.py).
A client that stays connected but stops reading is cut the same way once one send has waited
`[server] stalled_reader_s` (edge/stalled_readers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import anyio
import structlog
from litestar.types import Receive, Scope, Send

from edge.body_chunks import WRITE_NOW, WriteNow
from edge.cancel.scope import cancel_scope
from edge.disconnect_watch import DISCONNECT_WATCH, DisconnectWatch
from edge.errors import in_stream, internal_error, shutting_down_error
from edge.generation import Generation
from edge.sse import DONE, event
from edge.stalled_readers import SendProgress, StalledReaders
from edge.stream_gate import RAW_SEND

log = structlog.get_logger("floodgate.streaming")
T = TypeVar("T")

# How long a stream cancelled by the server's exit may take to write its last events.
_LAST_WORDS_S = 1.0
# The error event of a stream the server's exit cuts: the drain's own, its retry hint included
# (`retry_after_ms`, the 503's Retry-After: another instance takes the retry at once). Without
# it the event said only "Please retry", and a client left to its own backoff could not tell it
# from the drain's cut of the same stream.
_SHUTTING_DOWN = in_stream(shutting_down_error())

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:
        pass  # a connection that cannot be read any more is as gone as a disconnected one
    scope.cancel()


async def until_disconnect(
    asgi_scope: Scope,
    receive: Receive,
    work: Callable[[], Awaitable[T]],
    scope: anyio.CancelScope | None = None,
) -> T | None:
    """Run `work`, cancelled if the client goes away or `scope` is cancelled (then None). ApiError
    passes through as is.

    Under the edge's protocol its disconnect watch cancels the scope (edge/disconnect_watch.py):
    no task per request. Elsewhere the watch is one plain task cancelled at the end, not an anyio
    task group: a group costs a cancel scope, a task handle and, when cancelled, a formatted repr
    of the task, all per stream (about 5 % of a one-token stream's event-loop time in the profile
    of docs/bench-streams.md)."""
    scope = cancel_scope() if scope is None else scope
    watch = cast(DisconnectWatch | None, asgi_scope.get(DISCONNECT_WATCH))
    if watch is not None:
        with scope:
            watch.watch(scope)
            try:
                return await work()
            finally:
                watch.unwatch()
        return None
    watcher = asyncio.get_running_loop().create_task(_cancel_on_disconnect(receive, scope))
    try:
        with scope:
            return await work()
        return None
    finally:
        watcher.cancel()


class EventStreamResponse:
    """The SSE answer of one admitted generation (an ASGI app Litestar returns as is)."""

    def __init__(self, generation: Generation) -> None:
        self._generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        generation = self._generation
        stalled: StalledReaders | None = getattr(scope["app"].state, "stalled_readers", None)
        # Cancelled by a disconnect (until_disconnect) or by the stalled-reader watch (progress.cut).
        cut_scope = cancel_scope()
        watch = cast(DisconnectWatch | None, scope.get(DISCONNECT_WATCH))
        progress = SendProgress(generation.request_id, cut_scope, None if watch is None else watch.buffered)
        now = asyncio.get_running_loop().time
        # The body goes to the server's own send when the stream gate kept it (edge/stream_gate.py):
        # Litestar's wrapper only watches for the response start, and a token need not pass it.
        body_send = cast(Send, scope.get(RAW_SEND, send))
        # A chunk skips the send altogether when nothing would make it wait (edge/body_chunks.py).
        write_now = cast(WriteNow | None, scope.get(WRITE_NOW))

        async def emit(chunk: bytes) -> None:
            if write_now is not None and write_now(chunk):
                return
            # uvicorn's send waits (flow control) while the client reads nothing: the watch sees it.
            progress.waiting_since = now()
            try:
                await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                # Also when the wait is cancelled: the first token stops a keep-alive waiting on a
                # paused connection, and the tokens after it, written straight to the connection
                # (write_now), would leave that wait's start here, for the watch to cut a stream
                # whose client reads every token `stalled_reader_s` later.
                progress.waiting_since = None

        async def end(chunk: bytes) -> None:
            # The last events and the end of the body (chunked; to HTTP/1.0, the close) in one write.
            progress.waiting_since = now()
            await body_send({"type": "http.response.body", "body": chunk, "more_body": False})
            progress.waiting_since = None
            progress.ended = True

        # The task uvicorn cancels at its exit (a plain stop, or a stream past the drain deadline and
        # its grace); a hang-up or a stalled reader cancels `cut_scope` in the generation's task only.
        request_task = asyncio.current_task()

        def exiting() -> bool:
            return request_task is not None and request_task.cancelling() > 0

        async def produce() -> None:
            try:
                await generation.stream(emit, end, write_now, exiting)
            except Exception as exc:
                # The headers are gone: the stream itself must say it failed, then end.
                log.error("stream_failed", request_id=generation.request_id, exc_info=exc)
                if progress.ended:
                    return  # failed after its last write: there is nothing left to tell the client
                await emit(event({"error": internal_error().detail}))
                await emit(DONE)

        headers = _SSE_HEADERS + [(k.encode(), v.encode()) for k, v in generation.headers.items()]
        if stalled is not None:
            stalled.watch(progress)
        started = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            started = True
            # The generation runs in a task of its own: each token then resumes its few frames only,
            # not the twenty of uvicorn, Litestar's middleware and route and this response above it
            # (about 1.5 µs a token, docs/bench-streams.md). Awaiting the task passes a cancel of
            # this one on to it, so the server's shutdown reaches the generation as before.
            await asyncio.get_running_loop().create_task(until_disconnect(scope, receive, produce, cut_scope))
            if not progress.cut and not progress.ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif progress.cut and watch is not None:
                # Cut: dropped at once, its unread buffer with it (a close waits for the reader).
                watch.abort()
        except asyncio.CancelledError:
            # The server cancelled this task: it is exiting before the stream ended (a second signal,
            # or a stream that outlived the drain). End it as every stream ends, if the client still
            # takes it, rather than with a bare close and uvicorn's traceback: with the events the
            # drain's cut of it sends (the text held back, its usage, the error event, [DONE]: the
            # generation's), or the error event alone where it was cut before it ran.
            log.warning("stream_cancelled_by_shutdown", request_id=generation.request_id)
            if started and not progress.ended:
                last = generation.exit_words or event({"error": _SHUTTING_DOWN}) + DONE
                with anyio.CancelScope(shield=True), anyio.move_on_after(_LAST_WORDS_S):
                    await send({"type": "http.response.body", "body": last, "more_body": False})
        finally:
            if stalled is not None:
                stalled.unwatch(progress)
            await generation.close()
