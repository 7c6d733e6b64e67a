"""The asynchronous client: `AsyncClient(...).chat.stream(...)`, for many concurrent streams."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Sequence
from contextlib import aclosing
from types import TracebackType
from typing import Any

import anyio
import httpx

from floodgate_client.client import (
    CANCEL_DRAIN_S,
    CANCEL_ON_EXIT_S,
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
    ended,
    http_timeout,
    shut_down,
)
from floodgate_client.decoder import ChunkDecoder
from floodgate_client.errors import (
    ConflictError,
    FloodgateError,
    NetworkError,
    RateLimitError,
    ServiceUnavailableError,
    StreamError,
    cancel_status,
    error_from_response,
    error_from_unread_response,
    naming,
    transport_cause,
    transport_failure,
    undecodable_stream,
)
from floodgate_client.events import ChatResult, Finished, StreamEvent
from floodgate_client.rate_limits import RateLimits
from floodgate_client.request import (
    CHAT_PATH,
    ChatRequest,
    Messages,
    auth_headers,
    cancel_path,
    edge_root,
)
from floodgate_client.retry import Attempts, RetryPolicy
from floodgate_client.sse import ServerSentEvent, aiter_events

log = logging.getLogger("floodgate.client")


class AsyncClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_connections: int = 1000,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=edge_root(base_url),
            headers=auth_headers(api_key),
            timeout=http_timeout(timeout),
            # Every open stream holds a connection for its whole reply.
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=100),
        )
        self.chat = AsyncChat(self._http, max_retries)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncChat:
    def __init__(self, http: httpx.AsyncClient, max_retries: int) -> None:
        self._http = http
        self._max_retries = max_retries

    def stream(
        self,
        messages: Messages,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        conversation_id: str | None = None,
        auto_retry: bool = False,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> AsyncChatStream:
        """The stream opens on `await`, `async with` or the first `async for`; error answers raise
        there (429: RateLimitError); `auto_retry` sends a 408, 409, 429 or 5xx again as the sync
        `stream` does."""
        request = ChatRequest(messages, model, max_tokens, temperature, top_p, seed, stop, conversation_id)
        policy = RetryPolicy(self._max_retries if auto_retry else 0, deadline_s)
        return AsyncChatStream(self, request, policy)

    async def create(
        self,
        messages: Messages,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        conversation_id: str | None = None,
        auto_retry: bool = False,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> ChatResult:
        """The whole reply, streamed underneath."""
        async with self.stream(
            messages,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            conversation_id=conversation_id,
            auto_retry=auto_retry,
            deadline_s=deadline_s,
        ) as stream:
            finished = await stream.until_finished()
            return ChatResult.of(stream.text, finished, stream.request_id)

    async def cancel(self, request_id: str, *, timeout_s: float | None = None) -> str:
        """Stop a running generation. Raises NotFoundError (unknown or another user's id) or
        ConflictError (already finished); past `timeout_s` (each wait: for a connection, its connect,
        send, read; the client's timeout if None), NetworkError. Returns the server's status
        ("CANCELLED")."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s)
        request = self._http.build_request("POST", cancel_path(request_id), timeout=timeout)
        # As the sync cancel's: streamed, so that an undecodable answer still has its status.
        try:
            response = await self._http.send(request, stream=True)
            try:
                body = await response.aread()
            except httpx.DecodingError as exc:
                raise error_from_unread_response(response.status_code, response.headers, exc) from exc
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise transport_failure("cancel failed", exc) from transport_cause(exc)
        return cancel_status(response.status_code, response.headers, body)

    async def _open(self, request: ChatRequest, attempts: Attempts) -> httpx.Response:
        while True:
            if attempts.closed:
                # Closed during a wait before this attempt (a refusal's, or before the first).
                raise NetworkError("stream closed before its request was sent")
            headers = attempts.begin()
            try:
                response = await self._http.send(
                    self._http.build_request("POST", CHAT_PATH, json=request.body(), headers=headers),
                    stream=True,
                )
            except httpx.TransportError as exc:
                wait = attempts.network_retry_wait_s()
                if wait is not None:
                    # Waited as a refusal's is: a close or a cancel calls the retry off meanwhile.
                    log.info("retrying after a network error (%s) in %.2f s", type(exc).__name__, wait)
                    await attempts.apause(wait)
                    continue
                raise transport_failure("request failed", exc) from transport_cause(exc)
            if response.status_code == 200:
                return response
            try:
                body = await response.aread()
            except (httpx.TransportError, httpx.DecodingError) as exc:
                error = error_from_unread_response(response.status_code, response.headers, exc)
            else:
                error = error_from_response(response.status_code, response.headers, body)
            finally:
                await response.aclose()
            wait = attempts.refusal_wait_s(error)
            if wait is None:
                raise error
            log.info("HTTP %s (%s): retrying in %.2f s", error.status_code, error.code, wait)
            await attempts.apause(wait)


class AsyncChatStream:
    """One streamed reply; `async for` it for RequestStarted, TextDelta..., Finished.

    Retries, cancellation and reading on after its end behave as in the sync ChatStream.
    """

    def __init__(self, chat: AsyncChat, request: ChatRequest, policy: RetryPolicy) -> None:
        self._chat = chat
        self._request = request
        # As in the sync stream: a turn the edge may have stored is not sent twice.
        network_retries = 0 if request.conversation_id is not None else min(1, chat._max_retries)
        self._attempts = Attempts(policy, network_retries)
        self._decoder = ChunkDecoder()
        self._cancelled = False
        # Refused in its queue and waiting to be sent again (_reopen): nothing runs on the server.
        self._retrying = False
        # Reads wait until this (anyio's clock): forever, until a confirmed cancel bounds the rest.
        self._drain_deadline = math.inf
        self._read_scope: anyio.CancelScope | None = None
        self._ended_on_server = False
        # Its connection failed under it: the edge sees it go, which stops the generation, so no
        # cancel is sent on exit, to a peer that just failed to answer (CANCEL_ON_EXIT_S more).
        self._broken = False
        self._response: httpx.Response | None = None
        # Made on first use, in the event loop (open).
        self._opening: anyio.Lock | None = None
        # The generator holds this stream weakly, as the sync stream's does: a strong reference made
        # the two a cycle, and a loop left by `break` (or an exception) without an `async with` left
        # the reply generating until the cyclic collector freed them.
        self._events = AsyncChatStream._generate(weakref.proxy(self))
        # Read from at least once (collected, httpcore's stream then closes its own connection).
        self._read_from = False
        # The loop it was opened on, where a collected stream's response is closed (__del__).
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self) -> AsyncChatStream:
        """Send the request (once); error answers raise here. A stream cancelled before it opened
        opens to nothing: reading it gives Finished(cancelled=True)."""
        if self._response is None and not self._cancelled:
            # One opener at a time: `await stream` beside a task already reading it sent the request
            # twice, and the reply not kept was never read nor closed. The others get its response.
            if self._opening is None:
                self._opening = anyio.Lock()
            async with self._opening:
                if self._response is None and not self._cancelled:
                    await self._open_once()
        return self

    async def _open_once(self) -> None:
        # Raises once the stream was closed (before it was ever opened, too).
        try:
            response = await self._chat._open(self._request, self._attempts)
        except NetworkError:
            if not self._cancelled:
                raise
            return  # called off by a cancel() while it waited out a refusal
        if self._cancelled:
            # Cancelled while its request went out: the disconnect stops it on the edge.
            await response.aclose()
            return
        if self._attempts.closed:
            # Closed (from another task) while its request went out: close() found no response to
            # close, and the reader read the whole reply, generated and billed, from a closed
            # stream. Dropped as it opens instead (the disconnect stops it on the edge), as
            # _reopen drops a retry's.
            await response.aclose()
            raise NetworkError("stream closed")
        self._response = response
        with contextlib.suppress(RuntimeError):  # not asyncio (trio): no loop to close it on
            self._loop = asyncio.get_running_loop()

    def __await__(self) -> Generator[Any, None, AsyncChatStream]:
        return self.open().__await__()

    @property
    def request_id(self) -> str | None:
        if self._decoder.request_id is not None or self._response is None:
            return self._decoder.request_id
        header: str | None = self._response.headers.get("x-request-id")
        return header

    @property
    def text(self) -> str:
        return self._decoder.text

    @property
    def rate_limits(self) -> RateLimits:
        return RateLimits.from_headers(self._response.headers if self._response is not None else {})

    @property
    def headers(self) -> httpx.Headers:
        return self._response.headers if self._response is not None else httpx.Headers()

    @property
    def finished(self) -> Finished | None:
        return self._decoder.finished

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self

    async def __anext__(self) -> StreamEvent:
        self._read_from = True
        try:
            return await self._events.__anext__()
        except StopAsyncIteration:
            # As the sync stream's: spent before its Finished (closed, or ended by an error) raises.
            if self._decoder.finished is None:
                raise naming(NetworkError("stream closed before its Finished"), self.request_id) from None
            raise
        except FloodgateError as error:
            # Cut, or ended by an error: the error names its request, as an error answer does.
            naming(error, self.request_id)
            raise

    @property
    def retrying(self) -> bool:
        """Refused in its queue and waiting to be sent again: `cancel` calls the retry off."""
        return self._retrying

    async def until_finished(self) -> Finished:
        async for _ in self:
            pass
        return ended(self._decoder)

    async def cancel(self) -> bool:
        """Ask the server to stop generating. True when the server confirmed (or a retry waiting to
        be sent after a refusal, or a stream not open yet, was called off: it is never sent, or
        dropped as it opens); False when the request had already ended on the server: its reply
        finished, or an error event ended it and no retry follows. The
        stream then ends with Finished(cancelled=True): reading on gives what the server sent
        before the cancel reached it and its own ending, with usage, for at most CANCEL_DRAIN_S;
        then the connection is dropped."""
        if self._decoder.finished is not None or self._cancelled or self._ended_on_server:
            # Nothing runs on the server and no retry is to come (an error raised, not retried, ended
            # it: a refusal, a 502 before any text): nothing to cancel, and no retry to call off.
            return False
        if self._response is None:
            if self._attempts.closed:
                return False
            # Not open yet (its reader's task may be waiting out a 429 before it is): called off
            # here, or the request goes out once the wait is over and its reply streams, billed.
            self._cancelled = True
            self._attempts.closed = True
            return True
        if self._retrying:
            # As the sync stream's: the refused request ended on the server; the retry is called off.
            self._cancelled = True
            self._attempts.closed = True
            return True
        decoder = self._decoder
        request_id = self.request_id
        try:
            if request_id is None:
                raise NetworkError("no request id yet to cancel")
            await self._chat.cancel(request_id)
        except ConflictError:
            if decoder.refused:
                if self._decoder is not decoder:
                    # As the sync stream's: the retry is out already, cancelled under its own id.
                    return await self.cancel()
                self._cancelled = True
                self._attempts.closed = True
                return True
            self._ended_on_server = True
            return False
        except FloodgateError:
            await self.close()
            raise
        self._cancelled = True
        self._drain_deadline = anyio.current_time() + CANCEL_DRAIN_S
        if self._read_scope is not None:
            # Another task is waiting on the stream's next bytes: bound that wait too.
            self._read_scope.deadline = self._drain_deadline
        return True

    def __del__(self) -> None:
        """Dropped unclosed, as the sync stream's __del__: the socket is shut down, which the edge
        takes as a cancel, and the response is closed in a task on its loop: left open, its
        connection stayed checked out of the pool, a slot each, until none was left."""
        response: httpx.Response | None = getattr(self, "_response", None)
        # Once read from, httpcore's own stream, closed as it is collected, lets the connection go.
        if response is None or response.is_closed or self._read_from:
            return
        shut_down(response)
        loop = getattr(self, "_loop", None)
        if loop is not None and not sys.is_finalizing():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is left to free
                loop.call_soon_threadsafe(_close_later, loop, response)

    async def close(self) -> None:
        # Never reopened after (a reader iterating on got a new request).
        self._attempts.closed = True
        if self._response is not None:
            await self._response.aclose()

    async def __aenter__(self) -> AsyncChatStream:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        running = self._decoder.finished is None and not (
            self._cancelled or self._ended_on_server or self._broken or self._decoder.ended_by_error
        )
        request_id = self.request_id
        # Shielded: the block may be exiting because its task is being cancelled. Closed first, as
        # the sync ChatStream: the edge takes the disconnect as a cancel, and this stream's connection
        # goes back to the pool, where a cancel sent before it waited the whole bound (5 s) with every
        # connection taken, the generation running on meanwhile.
        with anyio.CancelScope(shield=True):
            try:
                await self._events.aclose()
            except RuntimeError:
                # Another task is reading it ("already running"): close() ends that read
                # (NetworkError: stream closed), and the cancel still goes.
                pass
            await self.close()
        # Bounded: the disconnect has stopped the generation already; the cancel makes it certain.
        with anyio.move_on_after(CANCEL_ON_EXIT_S, shield=True):
            if running and request_id is not None:
                try:
                    await self._chat.cancel(request_id)
                except FloodgateError as error:
                    log.debug("cancel on exit: %s", type(error).__name__)

    def _overload_wait_s(self, error: FloodgateError) -> float | None:
        if self._decoder.saw_text or self._cancelled:
            return None
        return self._attempts.refusal_wait_s(error)

    async def _next_event(self, events: AsyncGenerator[ServerSentEvent, None]) -> ServerSentEvent | None:
        """The stream's next event; None at its end, or once a cancel's bound on the rest has passed.
        The scope covers this one wait, never a yield of the stream's own generator."""
        with anyio.CancelScope(deadline=self._drain_deadline) as scope:
            self._read_scope = scope
            try:
                return await anext(events, None)
            finally:
                self._read_scope = None
        return None

    def _cancelled_ending(self) -> list[StreamEvent]:
        """The server confirmed a cancel; unless its own final chunk was read already, end here."""
        return [] if self._decoder.finished is not None else [self._decoder.finish_cancelled()]

    async def _generate(self) -> AsyncGenerator[StreamEvent, None]:
        await self.open()
        if self._response is None:
            # Cancelled before it opened: nothing was sent, or what was is dropped.
            for event in self._cancelled_ending():
                yield event
            return
        while True:
            assert self._response is not None
            try:
                async with aclosing(aiter_events(self._response.aiter_bytes())) as events:
                    while (sse := await self._next_event(events)) is not None:
                        for event in self._decoder.feed(sse):
                            yield event
                if self._cancelled and self._decoder.finished is None:
                    # The server's ending did not come in time: drop the connection.
                    await self._response.aclose()
                for event in self._cancelled_ending() if self._cancelled else self._decoder.end_of_stream():
                    yield event
                return
            except (RateLimitError, ServiceUnavailableError, StreamError) as error:
                if not self._decoder.refused:
                    raise  # not a refusal (a malformed chunk, a replica failing after text)
                # As in the sync stream: refused in its queue, or its replica failed, before any
                # reply: waited out and reopened.
                wait = self._overload_wait_s(error)
                if wait is None:
                    # Refused: nothing runs on the server for a cancel on exit to stop.
                    self._ended_on_server = True
                    if self._cancelled:
                        # A cancel came just after the refusal and called its retry off.
                        for event in self._cancelled_ending():
                            yield event
                        return
                    raise
                self._retrying = True  # from the moment it says so
                log.info("%s in the stream: retrying in %.2f s", error.code, wait)
                try:
                    await self._reopen(wait)
                except NetworkError:
                    if not self._cancelled:
                        raise
                    for event in self._cancelled_ending():  # called off while it waited
                        yield event
                    return
            except httpx.DecodingError as exc:
                # Not sent again, even before its first text: no network failure, but an answer
                # that would likely come as garbled again (and be generated, billed, again).
                raise undecodable_stream(exc, self._response.headers) from exc
            except (httpx.TransportError, httpx.StreamError, NetworkError) as exc:
                if self._cancelled:
                    for event in self._cancelled_ending():
                        yield event
                    return
                if self._attempts.closed:
                    # Closed by its reader (or a failed cancel): never reopened behind its back.
                    raise transport_failure("stream closed", exc) from transport_cause(exc)
                # Never reopened once its answer began, text or not: the edge charges a request
                # its replica took, and its first tokens may carry no text yet (held back as a stop
                # string's start, or a character's first bytes): a reopen generated and charged
                # the reply twice.
                self._broken = True
                raise transport_failure("stream broken", exc) from transport_cause(exc)

    async def _reopen(self, wait_s: float = 0.0) -> None:
        """As the sync stream's: the same request again, never once the stream is closed."""
        assert self._response is not None
        await self._response.aclose()
        self._retrying = True
        try:
            await self._attempts.apause(wait_s)
            self._response = await self._chat._open(self._request, self._attempts)
            self._decoder = ChunkDecoder()
        finally:
            self._retrying = False
        if self._attempts.closed:
            await self._response.aclose()
            raise NetworkError("stream closed")


# The closes of collected streams' responses under way (a task only the loop refers to may be
# collected before it ends).
_closing: set[asyncio.Task[None]] = set()


def _close_later(loop: asyncio.AbstractEventLoop, response: httpx.Response) -> None:
    task = loop.create_task(_aclose_quietly(response))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _aclose_quietly(response: httpx.Response) -> None:
    # Its socket shut down already: what failing to close it says, nobody is there to hear.
    with contextlib.suppress(Exception):
        await response.aclose()
