"""Running a generation as an ASGI response while watching the client's connection.

Litestar's own Stream response cancels its iterator on disconnect but may leave it un-closed, and
a generation must release its slot, settle its lease and abort the engine sequence at once. So the
request task runs the generation itself and a watcher cancels it when `http.disconnect` arrives.
A client that stays connected but stops reading is cut the same way once one send has waited
`[server] stalled_reader_s` (edge/stalled_readers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import structlog
from litestar.types import Receive, Scope, Send

from edge.errors import ApiError, ErrorDetail
from edge.pipeline import Generation
from edge.sse import DONE, event
from edge.stalled_readers import SendProgress, StalledReaders

log = structlog.get_logger("floodgate.streaming")
T = TypeVar("T")

# How long a stream cancelled by the server's exit may take to write its last events.
_LAST_WORDS_S = 1.0
_SHUTTING_DOWN = ErrorDetail(
    "This server is shutting down. Please retry; another instance will take the request.",
    "service_unavailable",
    code="server_shutting_down",
)

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def until_disconnect(receive: Receive, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run `work`, cancelled if the client goes away (then None). ApiError passes through as is."""
    result: T | None = None
    error: ApiError | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
        try:
            result = await work()
        except ApiError as exc:
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return result


class EventStreamResponse:
    """The SSE answer of one admitted generation (an ASGI app Litestar returns as is)."""

    def __init__(self, generation: Generation) -> None:
        self._generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        generation = self._generation
        stalled: StalledReaders | None = getattr(scope["app"].state, "stalled_readers", None)
        cut_scope = anyio.CancelScope()
        progress = SendProgress(generation.request_id, cut_scope)
        now = asyncio.get_running_loop().time

        async def emit(chunk: bytes) -> None:
            # uvicorn's send waits (flow control) while the client reads nothing: the watch sees it.
            progress.waiting_since = now()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            progress.waiting_since = None

        async def produce() -> None:
            try:
                await generation.stream(emit)
            except Exception as exc:
                # The headers are gone: the stream itself must say it failed, then end.
                log.error("stream_failed", request_id=generation.request_id, exc_info=exc)
                detail = ErrorDetail("The server had an error while processing your request.", "api_error")
                await emit(event({"error": detail}))
                await emit(DONE)

        headers = _SSE_HEADERS + [(k.encode(), v.encode()) for k, v in generation.headers.items()]
        if stalled is not None:
            stalled.watch(progress)
        started = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            started = True
            with cut_scope:
                await until_disconnect(receive, produce)
            if not progress.cut:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            # Cut: the response stays unfinished, and uvicorn closes the connection.
        except asyncio.CancelledError:
            # The server cancelled this task: it is exiting before the stream ended (a second signal,
            # or a stream that outlived the drain). End it as every stream ends, if the client still
            # takes it, rather than with a bare close and uvicorn's traceback.
            log.warning("stream_cancelled_by_shutdown", request_id=generation.request_id)
            if started:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_LAST_WORDS_S):
                    for chunk in (event({"error": _SHUTTING_DOWN}), DONE, b""):
                        await send({"type": "http.response.body", "body": chunk, "more_body": bool(chunk)})
        finally:
            if stalled is not None:
                stalled.unwatch(progress)
            await generation.close()
