"""The door in front of new generations: shut while the process drains, and past its capacity.

Both refusals must be cheap and must happen before any work (body parsing, tokenizing, the
limiter): they are what keeps an overloaded or leaving process answering instead of resetting
connections. So this is an ASGI middleware around `POST /v1/chat/completions` that counts the
generations open in this process (from the request's start to the end of its stream):

* draining (edge/drain.py): 503 `server_shutting_down` with `Retry-After`; another instance
  behind the load balancer will take the retry, on a new connection: this one closes once what is
  left of the body is read off (a second at most).
* `[server] max_open_streams` already open: 429 `server_busy` with `Retry-After` (the OpenAI SDK
  retries it), never a queue of connections the loop cannot serve.

The paid reserve. The door counts every tier alike, since it opens before the key is read; so a free
flood that held every stream would turn paid users away at the door, whatever the admission queue
keeps for them behind it. Once the request is known to be good and whose it is (`hold_reserve`,
called by the pipeline just before the limiter), a tier without the reserve (TierConfig.
may_use_reserve, as the admission queue's) is refused 429 `server_busy` while the free share of the
door is full: streams past `1 - [admission] reserved_paid_fraction` of max_open_streams are kept for
paid users. A bad request still gets its own 400 or 404 first (a 429 would have the SDK retry it),
and so does one no replica could ever hold (Dispatcher.check_fits, 0.35 µs: told server_busy, it
was retried for good). That refusal costs the request's parsing and its ticket (its prefix's
routing hashes: 1 µs for a short prompt, 74 µs for one of 4,096 tokens, next to the ms its
encoding took), never the limiter; the door's own refusal stays the cheap one, at the cap.

A request takes its place when its body has arrived, not at the door: until then it is no
generation, and the reserve cannot be checked for it. Counted from the door, a free key's requests
that sent their headers and trickled their bodies (each held until `[server] body_timeout_s`) held
every place, past the paid reserve, and paid users met 429 at the door meanwhile. The door still
refuses at the cap before reading anything; at the body's end the cap is checked again (the
refusal is then raised from `receive`, answered by the app's handler as the body deadline's 408 is).

A free request takes no place past the free share. The app reads the key before the body and marks
a tier without the reserve (`NO_RESERVE`); such a request whose body arrives while the free share is
full is not counted, and `hold_reserve` refuses it once it has been validated. Counted, it held one
of the paid places while it was parsed and its prompt encoded (a long prompt's wait for a worker
thread, behind every other long prompt): a free flood of long prompts (one key's is enough: its
concurrency limit is checked after the reserve) filled the door, and paid users met 429 server_busy.

A user takes no more places at its body's end than the streams it may run at once (its tier's
max_concurrent, `PLACE_OWNER`, set by the app with NO_RESERVE). Past that, the request holds none
while it is parsed and its prompt encoded, and takes its place (or its 429 server_busy, where the
door or the free share is full by then) in `hold_reserve`, just before the limiter, which refuses it
for the user's concurrency unless one of its streams ended meanwhile. Counted from the body's end,
one free user's flood of long prompts, waiting for encode threads, held every place of the free
share however few of them its concurrency limit would let run, and every other free user met 429
server_busy at the door meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass

import msgspec
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from edge.admission.paid_reserve import limit_for
from edge.drain import Drain
from edge.errors import (
    DRAINING_RETRY_AFTER_S,
    ApiError,
    ErrorBody,
    ErrorDetail,
    count_refusal,
    log_refusal,
    retry_after_headers,
)
from edge.metrics import OPEN_STREAMS, PAID_SHARE_KEPT

GENERATION_PATH = "/v1/chat/completions"
# The scope key under which the gate keeps the send it was given, for a stream's body chunks: the
# sends Litestar wraps it in further in only watch for the response start (edge/streaming.py).
RAW_SEND = "floodgate.send"
# Past capacity the wait is about one stream's life; the SDK adds jitter, so a second is a fair ask.
BUSY_RETRY_AFTER_S = 1.0


BUSY_MESSAGE = "This server holds as many streams as it can. Please try again shortly."
# How long a refusal that closes the connection reads the rest of the body first (the server's
# protocol lingers as long after its own: edge/http_protocol.py).
CLOSE_READ_OFF_S = 1.0
# The scope key the app sets, once the key is read, for a tier that may not use the paid reserve.
NO_RESERVE = "floodgate.no_reserve"
# The scope key the app sets, once the key is read: (user, the most streams its tier may run at
# once), the most places the user's requests take at their bodies' end.
PLACE_OWNER = "floodgate.place_owner"


@dataclass(slots=True)
class _Place:
    """One generation request's standing at the door, from its body's end to its end."""

    # Whose place it is: the user it is counted under (None before the key is known).
    user: str | None = None
    # It holds a place, given back when the request ends.
    counted: bool = False
    # Its body arrived past the free share: it holds no place, and hold_reserve refuses it.
    past_free_share: bool = False
    # Its body arrived while its user held as many places as it may run streams: it takes its place
    # in hold_reserve, if the door has one then.
    deferred: bool = False


# The place of the request whose task this is (None outside the door's generations).
_PLACE: ContextVar[_Place | None] = ContextVar("floodgate_place", default=None)


class StreamGate:
    def __init__(self, drain: Drain, max_open_streams: int, reserved_paid_fraction: float = 0.0) -> None:
        if max_open_streams < 1:
            raise ValueError("max_open_streams must be positive")
        self.drain = drain
        self.max_open_streams = max_open_streams
        # What tiers without the reserve may hold; never none, or a small cap would shut them out.
        self.unreserved_streams = max(1, limit_for(max_open_streams, False, reserved_paid_fraction))
        self.open_streams = 0
        # The places each user's requests hold (a user holding none is not kept).
        self._held: Counter[str] = Counter()

    def hold_reserve(self, may_use_reserve: bool) -> None:
        """For a generation already through the door whose tier is now known: raise ApiError 429
        `server_busy` if its tier may not use the paid reserve and the door's free share is full
        (this stream counted), or if it is yet to take its place (see the module doc) and the door
        has none for it."""
        place = _PLACE.get()
        if place is not None and place.deferred:
            place.deferred = False
            if self.open_streams >= self.max_open_streams:
                raise _busy_error()
            if not may_use_reserve and self.open_streams >= self.unreserved_streams:
                PAID_SHARE_KEPT.inc()
                raise _busy_error()
            self._take(place)
            return
        past_share = place is not None and place.past_free_share
        if not may_use_reserve and (past_share or self.open_streams > self.unreserved_streams):
            PAID_SHARE_KEPT.inc()
            raise _busy_error()

    def _take(self, place: _Place) -> None:
        place.counted = True
        self.open_streams += 1
        OPEN_STREAMS.inc()
        if place.user is not None:
            self._held[place.user] += 1

    def _give_back(self, place: _Place) -> None:
        self.open_streams -= 1
        OPEN_STREAMS.dec()
        if place.user is not None:
            self._held[place.user] -= 1
            if not self._held[place.user]:
                del self._held[place.user]

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """The Litestar middleware factory (`Litestar(middleware=[gate.middleware])`)."""

        async def gate(scope: Scope, receive: Receive, send: Send) -> None:
            if (
                scope["type"] != ScopeType.HTTP
                or scope["path"] != GENERATION_PATH
                or scope.get("method") != "POST"
            ):
                await app(scope, receive, send)
                return
            if self.drain.draining:
                await _refuse(
                    scope,
                    send,
                    503,
                    ErrorDetail(
                        "This server is shutting down. Please retry; another instance will take it.",
                        "service_unavailable",
                        code="server_shutting_down",
                    ),
                    DRAINING_RETRY_AFTER_S,
                    # The client's next try opens a new connection, which the balancer sends elsewhere.
                    close_after=receive,
                )
                return
            if self.open_streams >= self.max_open_streams:
                await _refuse(
                    scope,
                    send,
                    429,
                    ErrorDetail(BUSY_MESSAGE, "rate_limit_exceeded", code="server_busy"),
                    BUSY_RETRY_AFTER_S,
                )
                return
            place = _Place()

            async def receive_counted() -> ReceiveMessage:
                message = await receive()
                if place.counted or message["type"] != "http.request" or message.get("more_body", False):
                    return message
                # The body has arrived: from here the request is a generation (see module doc).
                if self.open_streams >= self.max_open_streams:
                    raise _busy_error()
                if scope.get(NO_RESERVE) and self.open_streams >= self.unreserved_streams:
                    # To be refused once validated (hold_reserve): meanwhile no place of the paid share.
                    place.past_free_share = True
                    return message
                owner: tuple[str, int] | None = scope.get(PLACE_OWNER)  # type: ignore[assignment]
                if owner is not None:
                    place.user, most = owner
                    if self._held[place.user] >= most:
                        # Its place waits for hold_reserve (see module doc).
                        place.deferred = True
                        return message
                self._take(place)
                return message

            scope[RAW_SEND] = send  # type: ignore[literal-required]
            placed = _PLACE.set(place)
            try:
                await app(scope, receive_counted, send)
            finally:
                _PLACE.reset(placed)
                # `send` reaches the server's request cycle, which holds this scope: left here, the
                # request's cycle, scope and headers would be garbage only the collector frees.
                del scope[RAW_SEND]  # type: ignore[misc]
                if place.counted:
                    self._give_back(place)

        return gate


def _busy_error() -> ApiError:
    """429 `server_busy`, for a request past the door (answered by the app's exception handler)."""
    return ApiError(
        429,
        BUSY_MESSAGE,
        type="rate_limit_exceeded",
        code="server_busy",
        headers=retry_after_headers(BUSY_RETRY_AFTER_S),
    )


async def _refuse(
    scope: Scope,
    send: Send,
    status: int,
    detail: ErrorDetail,
    retry_after_s: float,
    *,
    close_after: Receive | None = None,
) -> None:
    """`close_after`: the request's receive, where the answer closes the connection."""
    # At the door, before the body: no model or tier is known yet (the scope names neither).
    count_refusal(scope, status, detail.code or detail.type)
    # Its one line and its id, as the handlers' refusals.
    named = log_refusal(scope, status, detail.code or detail.type)
    body = msgspec.json.encode(ErrorBody(detail))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in (retry_after_headers(retry_after_s) | named).items()),
    ]
    if close_after is not None:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    # The whole answer now (its Content-Length is all of it); a closing one's end, which closes the
    # connection, once the rest of the body is read off.
    await send({"type": "http.response.body", "body": body, "more_body": close_after is not None})
    if close_after is not None:
        if not _expects_continue(scope):
            await _read_off(close_after)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _expects_continue(scope: Scope) -> bool:
    """The client waits to be told to send its body: never told, it sends none (and the server's
    protocol closes the connection lingering itself, edge/expect_continue.py). A read would tell it,
    after its answer."""
    return any(name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"])


async def _read_off(receive: Receive) -> None:
    """Read and drop what is left of the request's body, for CLOSE_READ_OFF_S at most. Closed with
    the client's bytes unread, the socket sends a reset, which can reach the client before the
    answer and destroy it; a client still sending its body met it at its next write."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CLOSE_READ_OFF_S):
            while True:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
