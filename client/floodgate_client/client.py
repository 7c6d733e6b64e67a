"""The synchronous client: `Client(...).chat.stream(...)` yields typed events as tokens arrive."""

from __future__ import annotations

import contextlib
import inspect
import logging
import socket
import sys
import threading
import weakref
from asyncio.trsock import TransportSocket
from collections.abc import Generator, Iterator, Sequence
from types import TracebackType

import httpx

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
from floodgate_client.sse import iter_events

log = logging.getLogger("floodgate.client")

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_RETRIES = 2
DEFAULT_DEADLINE_S = 60.0
# Leaving a `with` block early closes the connection, which stops the generation on its own; the cancel
# sent after is a courtesy, not worth holding the caller up for (the async client caps it the same).
CANCEL_ON_EXIT_S = 5.0
# After a confirmed cancel the server still ends the stream itself: its final chunk (marked cancelled),
# then usage and [DONE], at once. They are read for at most this long; then the connection is dropped
# and the stream ends cancelled without usage (the async client bounds it the same).
CANCEL_DRAIN_S = 2.0


def http_timeout(timeout_s: float) -> httpx.Timeout:
    """`timeout_s` bounds each read: a queued request still gets keep-alives well within it."""
    return httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))


class Client:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        self._http = httpx.Client(
            base_url=edge_root(base_url), headers=auth_headers(api_key), timeout=http_timeout(timeout)
        )
        self.chat = Chat(self._http, max_retries)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Chat:
    def __init__(self, http: httpx.Client, max_retries: int) -> None:
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
    ) -> ChatStream:
        """Send the request and return its open stream. Error answers raise here (429: RateLimitError);
        with `auto_retry`, a 408, 409, 429 or 5xx (as the OpenAI SDK chooses) is sent again after the
        server's advised wait, at most max_retries times, within `deadline_s`."""
        request = ChatRequest(messages, model, max_tokens, temperature, top_p, seed, stop, conversation_id)
        policy = RetryPolicy(self._max_retries if auto_retry else 0, deadline_s)
        return ChatStream(self, request, policy)

    def create(
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
        with self.stream(
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
            finished = stream.until_finished()
            return ChatResult.of(stream.text, finished, stream.request_id)

    def cancel(self, request_id: str, *, timeout_s: float | None = None) -> str:
        """Stop a running generation. Raises NotFoundError (unknown or another user's id) or
        ConflictError (already finished); past `timeout_s` (each wait: for a connection, its connect,
        send, read; the client's timeout if None), NetworkError. Returns the server's status
        ("CANCELLED")."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s)
        request = self._http.build_request("POST", cancel_path(request_id), timeout=timeout)
        # Streamed, so that an answer whose body cannot be decoded still has its status to say which.
        try:
            response = self._http.send(request, stream=True)
            try:
                body = response.read()
            except httpx.DecodingError as exc:
                raise error_from_unread_response(response.status_code, response.headers, exc) from exc
            finally:
                response.close()
        except httpx.TransportError as exc:
            raise transport_failure("cancel failed", exc) from transport_cause(exc)
        return cancel_status(response.status_code, response.headers, body)

    def _open(self, request: ChatRequest, attempts: Attempts) -> httpx.Response:
        while True:
            if attempts.closed:
                # Closed during a wait before this attempt (a refusal's, or before the first).
                raise NetworkError("stream closed before its request was sent")
            headers = attempts.begin()
            try:
                response = self._http.send(
                    self._http.build_request("POST", CHAT_PATH, json=request.body(), headers=headers),
                    stream=True,
                )
            except httpx.TransportError as exc:
                wait = attempts.network_retry_wait_s()
                if wait is not None:
                    # Waited as a refusal's is: a close or a cancel calls the retry off meanwhile.
                    log.info("retrying after a network error (%s) in %.2f s", type(exc).__name__, wait)
                    attempts.pause(wait)
                    continue
                raise transport_failure("request failed", exc) from transport_cause(exc)
            if response.status_code == 200:
                return response
            try:
                body = response.read()
            except (httpx.TransportError, httpx.DecodingError) as exc:
                error = error_from_unread_response(response.status_code, response.headers, exc)
            else:
                error = error_from_response(response.status_code, response.headers, body)
            finally:
                response.close()
            wait = attempts.refusal_wait_s(error)
            if wait is None:
                raise error
            log.info("HTTP %s (%s): retrying in %.2f s", error.status_code, error.code, wait)
            attempts.pause(wait)


class ChatStream:
    """One streamed reply. Iterate it for RequestStarted, TextDelta..., Finished.

    A network failure before the answer's head (no connection, a connection dropped unanswered)
    sends the request again once; once the stream has opened, a network failure raises NetworkError,
    text or not: the edge charges a request its replica took, whose first tokens may carry no text
    yet, and a reply is never silently restarted. A stream that ended before its Finished
    (closed, left by its `with` block, or ended by an error) is never reopened: reading on raises
    NetworkError ("stream closed"); a finished one reads as empty, and until_finished gives its Finished
    again. A request with a `conversation_id` is never reopened: the edge may already
    have stored its turn, and a second request would store the same user message again. Leaving a `with`
    block before the end cancels the generation on the server.
    """

    def __init__(self, chat: Chat, request: ChatRequest, policy: RetryPolicy) -> None:
        self._chat = chat
        self._request = request
        # One more send after a network failure before the answer's head; none for a request with
        # a conversation_id, whose turn the edge may already have stored.
        network_retries = 0 if request.conversation_id is not None else min(1, chat._max_retries)
        self._attempts = Attempts(policy, network_retries)
        self._decoder = ChunkDecoder()
        self._cancelled = False
        # Refused in its queue and waiting to be sent again (_reopen): nothing runs on the server.
        self._retrying = False
        self._cut_off: CutOff | None = None
        self._ended_on_server = False
        # Its connection failed under it: the edge sees it go, which stops the generation, so no
        # cancel is sent on exit, to a peer that just failed to answer (CANCEL_ON_EXIT_S more).
        self._broken = False
        self._response = chat._open(request, self._attempts)
        # The generator holds this stream by a weak reference: a strong one made the two a cycle, so
        # a loop left by `break` (or an exception) without a `with` freed neither until the cyclic
        # collector ran, which an idle program may never do, and the edge generated the whole reply,
        # billed. Freed at once, the generator's close closes httpcore's stream, and the connection.
        self._events = ChatStream._generate(weakref.proxy(self))
        # Read from at least once (collected, httpcore's stream then closes its own connection).
        self._read_from = False

    @property
    def request_id(self) -> str | None:
        return self._decoder.request_id or self._response.headers.get("x-request-id")

    @property
    def text(self) -> str:
        """The reply so far."""
        return self._decoder.text

    @property
    def rate_limits(self) -> RateLimits:
        return RateLimits.from_headers(self._response.headers)

    @property
    def headers(self) -> httpx.Headers:
        return self._response.headers

    @property
    def finished(self) -> Finished | None:
        return self._decoder.finished

    def __iter__(self) -> Iterator[StreamEvent]:
        return self

    def __next__(self) -> StreamEvent:
        self._read_from = True
        try:
            return next(self._events)
        except StopIteration:
            # Its generator is spent: ended with its Finished, or closed or ended by an error before
            # it, which read on as an empty stream, a reply of nothing.
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

    def until_finished(self) -> Finished:
        """Read the rest of the stream; the final event."""
        for _ in self:
            pass
        return ended(self._decoder)

    def cancel(self) -> bool:
        """Ask the server to stop generating. True when the server confirmed (or a retry waiting to
        be sent after a refusal was called off); False when the request had already ended on the
        server: its reply finished, or an error event ended it and no retry follows. The
        stream then ends with Finished(cancelled=True): reading on gives what the server sent
        before the cancel reached it and its own ending, with usage, for at most CANCEL_DRAIN_S;
        then the connection is dropped."""
        if self._decoder.finished is not None or self._cancelled or self._ended_on_server:
            # Nothing runs on the server and no retry is to come (an error raised, not retried, ended
            # it: a refusal, a 502 before any text): nothing to cancel, and no retry to call off.
            return False
        if self._retrying:
            # The refused request ended on the server (a cancel of it answers 409): the retry is
            # called off instead, or the reply it would start streams and is billed (a review).
            self._cancelled = True
            self._attempts.closed = True
            return True
        decoder = self._decoder
        request_id = self.request_id
        try:
            if request_id is None:
                raise NetworkError("no request id yet to cancel")
            self._chat.cancel(request_id)
        except ConflictError:
            if decoder.refused:
                if self._decoder is not decoder:
                    # The retry is out already: cancelled under its own id (or it finished).
                    return self.cancel()
                # Refused in the stream, its retry not out yet (the flag above was not set yet, or
                # cleared already): called off.
                self._cancelled = True
                self._attempts.closed = True
                return True
            self._ended_on_server = True
            # Finished on the server already: the rest of the reply is on its way; let it be read.
            return False
        except FloodgateError:
            # Dropping the connection still stops the generation server-side.
            self.close()
            raise
        self._cancelled = True
        if self._decoder.finished is None:
            # A reader (this thread's next read, or another thread's blocked one) gets the server's
            # ending, or, should it not come in time, the end of the connection.
            self._cut_off = CutOff(self._response, CANCEL_DRAIN_S)
        return True

    def close(self) -> None:
        # Never reopened after (a reader iterating on got a new request).
        self._attempts.closed = True
        self._disarm()
        # A reader blocked in another thread (beside a cancel that failed) returns at once, not at
        # its read timeout: closing the socket under a read does not wake it.
        shut_down(self._response)
        if inspect.getgeneratorstate(self._events) != inspect.GEN_RUNNING:
            self._response.close()
        # else another thread is inside the stream: its read, ended by the shutdown, closes the
        # connection itself. Closed from here under that read, the socket's number was at times
        # taken by this thread's next connection (the exit's cancel, a next request), and the
        # read waited on that one to its timeout (4 runs in 150 of a probe).

    def __del__(self) -> None:
        """Dropped unclosed (never read to its end, no `with`): its connection stayed checked out of
        the pool, open, and the edge went on generating the reply (billed) for as long as the client
        lived. Its socket is shut down here, which the edge takes as a cancel; the response is closed
        on a thread of its own, as closing takes the pool's lock, which this thread may hold: a
        collection runs wherever an allocation triggers it, inside httpcore too."""
        response: httpx.Response | None = getattr(self, "_response", None)  # unset if _open raised
        if response is None or response.is_closed:
            return
        if self._read_from:
            # httpcore's own stream, closed as it is collected beside this, has let the connection
            # go (back to the pool, should its reply have ended): not to be touched.
            return
        shut_down(response)
        if sys.is_finalizing():
            # Collected as the interpreter shuts down (a global left unread): a thread started now
            # never runs, and start() waited for it forever, the program hung at its exit. The
            # shutdown above is the edge's cancel; the process's end closes the rest.
            return
        with contextlib.suppress(RuntimeError):  # "can't create new thread at interpreter shutdown"
            threading.Thread(target=response.close, daemon=True).start()

    def _disarm(self) -> None:
        if self._cut_off is not None:
            self._cut_off.disarm()
            self._cut_off = None

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        running = self._decoder.finished is None and not (
            self._cancelled or self._ended_on_server or self._broken or self._decoder.ended_by_error
        )
        request_id = self.request_id
        # Closed first: the edge takes the disconnect as a cancel, and this stream's connection goes back
        # to the pool, where a cancel sent before it could wait the whole timeout with every slot taken.
        try:
            self._events.close()
        except ValueError:
            # Another thread is reading it ("generator already executing"): it raised here, and the
            # generation ran on. close() ends that read (NetworkError: stream closed).
            pass
        self.close()
        if running and request_id is not None:
            try:
                self._chat.cancel(request_id, timeout_s=CANCEL_ON_EXIT_S)
            except FloodgateError as error:
                # Not found or already finished: the disconnect has stopped it already.
                log.debug("cancel on exit: %s", type(error).__name__)

    def _overload_wait_s(self, error: FloodgateError) -> float | None:
        if self._decoder.saw_text or self._cancelled:
            return None
        return self._attempts.refusal_wait_s(error)

    def _cancelled_ending(self) -> list[StreamEvent]:
        """The server confirmed a cancel; unless its own final chunk was read already, end here."""
        self._disarm()
        return [] if self._decoder.finished is not None else [self._decoder.finish_cancelled()]

    def _generate(self) -> Generator[StreamEvent, None, None]:
        while True:
            try:
                for sse in iter_events(self._response.iter_bytes()):
                    yield from self._decoder.feed(sse)
                    if self._decoder.finished is not None:
                        # Before the connection goes back to the pool, where a cut-off must not reach it.
                        self._disarm()
                if self._cancelled:
                    yield from self._cancelled_ending()
                else:
                    yield from self._decoder.end_of_stream()
                return
            except (RateLimitError, ServiceUnavailableError, StreamError) as error:
                if not self._decoder.refused:
                    raise  # not a refusal (a malformed chunk, a replica failing after text)
                # Refused in its queue after the stream opened, or its replica failed before any
                # text: no reply was started, so with auto_retry it is waited out and reopened as
                # the 429 or 502 before the stream would be.
                wait = self._overload_wait_s(error)
                if wait is None:
                    # Refused: nothing runs on the server for a cancel on exit to stop.
                    self._ended_on_server = True
                    if self._cancelled:
                        # A cancel came just after the refusal and called its retry off.
                        yield from self._cancelled_ending()
                        return
                    raise
                self._retrying = True  # from the moment it says so (the CLI's Ctrl-C reads it)
                log.info("%s in the stream: retrying in %.2f s", error.code, wait)
                try:
                    self._reopen(wait)
                except NetworkError:
                    if not self._cancelled:
                        raise
                    yield from self._cancelled_ending()  # called off while it waited
                    return
            except httpx.DecodingError as exc:
                # Not sent again, even before its first text: no network failure, but an answer
                # that would likely come as garbled again (and be generated, billed, again).
                raise undecodable_stream(exc, self._response.headers) from exc
            except (httpx.TransportError, httpx.StreamError, NetworkError) as exc:
                if self._cancelled:
                    yield from self._cancelled_ending()
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

    def _reopen(self, wait_s: float = 0.0) -> None:
        """The same request again after `wait_s`; never once the stream is closed (by its reader,
        or a cancel that failed), even while this waits or sends: _open checks before each attempt,
        and close() shuts the response it finds, so the new one is checked once it is in place."""
        self._response.close()
        self._retrying = True
        try:
            self._attempts.pause(wait_s)
            self._response = self._chat._open(self._request, self._attempts)
            self._decoder = ChunkDecoder()
        finally:
            self._retrying = False
        if self._attempts.closed:
            self._response.close()
            raise NetworkError("stream closed")


class CutOff:
    """Shuts a stream's connection down at a deadline, from a timer thread: a read blocked on a peer that
    has gone quiet then returns at once, as it would not if the socket were closed under it (the read
    holds it open). Disarmed before the connection can go back to the pool; a closed response, which
    may have gone back already, is never touched."""

    def __init__(self, response: httpx.Response, after_s: float) -> None:
        self._response = response
        self._lock = threading.Lock()
        self._armed = True
        self._timer = threading.Timer(after_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        with self._lock:
            self._armed = False
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            if not self._armed or self._response.is_closed:
                return
            log.info("no end of the stream within %.1f s of its cancel: dropping it", CANCEL_DRAIN_S)
            shut_down(self._response)


def ended(decoder: ChunkDecoder) -> Finished:
    """The Finished of a stream read to its end: __next__ raises for one that ends without it."""
    if decoder.finished is None:
        raise NetworkError("stream closed before its Finished")
    return decoder.finished


def shut_down(response: httpx.Response) -> None:
    """Shut an open streamed response's socket down: a read blocked on it returns at once."""
    if response.is_closed:
        return
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            # socket.socket's own: a TLS socket's would drop its TLS state under the reader.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
    elif isinstance(sock, TransportSocket):
        # An async stream's (asyncio keeps TLS above the socket, in its protocol).
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
