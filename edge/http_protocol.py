"""The HTTP/1.1 protocol the edge's uvicorn runs: uvicorn's httptools one, with a response's head
written with its first body bytes (edge/header_write.py) and a stream's token chunks written
without the ASGI send when nothing makes them wait (edge/body_chunks.py), and a client's disconnect
cancelling its generation from `connection_lost` (edge/disconnect_watch.py), and a deadline for each
request's headers (edge/header_timeout.py); an HTTP/1.0 request's stream delimited by the close,
not chunked (UntilCloseCycle); at the process's capacity the oldest idle connection closed for a
new one (edge/idle_connections.py), and where none is idle the new one answered 503 and closed
(edge/connection_cap.py)."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Sequence
from typing import ClassVar

import httptools
from uvicorn._types import ASGI3Application, ASGISendEvent
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from edge.body_chunks import WRITE_NOW, BodyChunkWriter
from edge.closing_refusal import ClosingRefusal
from edge.connection_cap import LINGER_S, TURNED_AWAY, busy_answer
from edge.cors import CrossOrigins
from edge.disconnect_watch import DISCONNECT_WATCH, DisconnectWatch
from edge.expect_continue import ExpectingCycle
from edge.header_timeout import HeaderDeadline, timeout_response
from edge.header_write import HeadHoldingTransport
from edge.idle_connections import IdleConnections
from edge.open_files import OPS_MAX_CONNECTIONS

# A request's URL and headers, together: past it the request is answered 431 and its connection
# closed. uvicorn keeps every header it is sent, before any route or key check runs, so without a
# bound one anonymous connection grew the process by 1.2 GB in under a second (600 MB of headers).
# 64 KiB is what an AWS load balancer forwards at most, and far above any real client's.
MAX_HEAD_BYTES = 64 * 1024
# How long the 431's connection stays open, its further bytes dropped, before it closes.
_LINGER_S = 1.0
# Requests a connection may have waiting behind the running one; one more closes it. uvicorn's
# pause at a pipelined request bounds nothing (it parses every request of a read, and resumes at
# each response and at each disconnect watch): one client writing requests in a loop had 1,338
# waiting and 80 MB of their bodies held in 8 s (a review). Each waiting request holds its head
# and up to a read of body (uvicorn pauses past 64 KiB).
MAX_PIPELINED = 16


class _HeadTooLarge(Exception):
    """Raised from the parser's callback: stops parsing the request (uvicorn then answers it through
    send_400_response, which answers 431 instead)."""


class _UpgradeAgain(Exception):
    """Raised from the parser's callback at a request read again for its upgrade (_parse) that still
    asks for one: a CONNECT, which llhttp takes for a tunnel whatever its headers. Read again, it
    asked again, for ever (a RecursionError, no answer, thousands of traceback lines for each one,
    no key needed); this is no proxy, and it is answered as invalid, through send_400_response."""


class _HostNotOne(Exception):
    """Raised from the parser's callback at a request with two Host headers, or an HTTP/1.1 one with
    none: RFC 9112 3.2 has both answered 400 (as h11 and nginx do), through send_400_response. Two
    hosts are two readings of where the request goes: a proxy in front may route by one, and
    Litestar checks only the first."""


class _VersionNotServed(Exception):
    """Raised from the parser's callback at a request of a version other than HTTP/1.1 and 1.0
    that llhttp parses all the same: HTTP/2.0, answered 505 (RFC 9110 15.6.6, as nginx), and a
    request line with no version at all (HTTP/0.9's), answered 400 as any malformed request line.
    Both were served as 1.0 and closed: the 2.0 client read an answer of a version it did not ask
    for, the 0.9 one a head it never asked for. Through send_400_response, as _HeadTooLarge."""


class _TransferCodingInOldVersion(Exception):
    """Raised from the parser's callback at an HTTP/1.0 request with a Transfer-Encoding header: RFC
    9112 6.1 has its framing treated as faulty (a 1.0 sender knows no transfer coding, and one in
    front that reads it as 1.0 frames its body otherwise: no body, the chunks the next request), as
    nginx answers it, 400. llhttp read it as chunked and it was served. Through send_400_response."""


class _UnknownTransferCoding(Exception):
    """Raised from the parser's callback at a transfer coding other than chunked (gzip, chunked):
    the parser frames the body by its chunks, and nothing here decodes the rest, so the body would
    be read still coded. Answered 501 (RFC 9112 6.1) through send_400_response, as _HeadTooLarge."""


_INVALID_HTTP = ClosingRefusal(
    b"400 Bad Request",
    "The request is not valid HTTP/1.1 (its request line, a header or its framing).",
    "invalid_http_request",
)
_HEAD_TOO_LARGE = ClosingRefusal(
    b"431 Request Header Fields Too Large",
    f"The request's URL and headers exceed {MAX_HEAD_BYTES // 1024} KiB.",
    "request_header_fields_too_large",
)
_VERSION_NOT_SUPPORTED = ClosingRefusal(
    b"505 HTTP Version Not Supported",
    "Only HTTP/1.1 and HTTP/1.0 are served here.",
    "http_version_not_supported",
)
_UNKNOWN_TRANSFER_CODING = ClosingRefusal(
    b"501 Not Implemented",
    "The request's Transfer-Encoding may only be chunked.",
    "unsupported_transfer_coding",
)


# The versions served; llhttp also parses 2.0 and a request line without one (0.9), answered 505
# and 400 (_VersionNotServed).
_SERVED_VERSIONS = ("1.1", "1.0")


class UntilCloseCycle(RequestResponseCycle):
    """An HTTP/1.0 request's cycle. uvicorn's httptools protocol frames every response without a
    content-length as chunked, whatever the request's version, and a 1.0 client, which does not
    know that coding (RFC 9112 7.1: a server must not send it one), read the chunk sizes as part
    of a stream's events. Here such a response (a stream) is sent as it is and ends where the
    connection closes, as RFC 9112 6.3 delimits a response with neither framing. uvicorn builds
    the cycle itself, so the protocol gives a 1.0 request's cycle this class once it is built."""

    # The response started without a length: its body is written unframed, the close ends it.
    until_close = False

    async def send(self, message: ASGISendEvent) -> None:
        if not self.until_close:
            if not self.response_started and message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() != b"transfer-encoding"
                ]
                status = message["status"]
                if (
                    self.scope["method"] != "HEAD"
                    and status >= 200
                    and status not in (204, 304)
                    and not any(name.lower() == b"content-length" for name, _ in headers)
                ):
                    # Not None: uvicorn adds no transfer-encoding (and no length is expected).
                    self.chunked_encoding = False
                    self.until_close = True
                message = {**message, "headers": headers}
            await super().send(message)
            return
        if self.response_complete or message["type"] != "http.response.body":
            await super().send(message)  # uvicorn's error for a message out of turn
            return
        # uvicorn's send for a body, less the framing.
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        body = message.get("body", b"")
        if body:
            self.transport.write(body)
        if not message.get("more_body", False):
            self.response_complete = True
            self.message_event.set()
            self.transport.close()
            self.on_response()


class EdgeHttpProtocol(HttpToolsProtocol):
    """`uvicorn.Config(http=edge_http_protocol(header_timeout_s, cors_allow_origins))`."""

    # Set by edge_http_protocol, from the server's settings.
    header_timeout_s: ClassVar[float]
    # The most connections the listener holds at once (edge/open_files.py connection_cap): a new one
    # past it is answered 503 and closed (`_turn_away`).
    max_connections: ClassVar[int]
    # The listener's idle connections: at the cap the oldest is closed for a new one, which is
    # turned away only where none is idle (edge/idle_connections.py).
    _idle: ClassVar[IdleConnections]
    _busy_answer: ClassVar[bytes]
    _header_timeout_response: ClassVar[ClosingRefusal]
    _cross_origins: ClassVar[CrossOrigins]
    # One per request whose response has not ended: the running one and any pipelined behind it.
    _disconnect_watches: list[DisconnectWatch]
    _raw_transport: asyncio.Transport
    _context: contextvars.Context
    _header_deadline: HeaderDeadline
    # A request has begun and its headers have not all come.
    _headers_pending = False
    # The current request's URL and header bytes so far (MAX_HEAD_BYTES), and whether it went past.
    _head_bytes = 0
    _head_too_large = False
    # The current request has had its Host header (_HostNotOne).
    _host_seen = False
    # The current request named a transfer coding other than chunked (_UnknownTransferCoding).
    _unknown_coding = False
    # The current request has a Transfer-Encoding header (_TransferCodingInOldVersion).
    _coding_seen = False
    # The current request is of a major version other than 1 (_VersionNotServed).
    _version_unsupported = False
    # The parser refused a request, or one was answered with its expected body unsent (the
    # connection closes after it, ExpectingCycle): the connection's further bytes are read and
    # dropped until it closes; a refusal's answer waits in `_refusal` while a request before it
    # has yet to be answered.
    _refused = False
    _refusal: tuple[bytes, bool] | None = None
    # A request that asked for an upgrade (never made here): its head again, less the Upgrade
    # header, for a fresh parser to read the request from (_parse); and whether that one is it.
    _upgrade_head: bytes | None = None
    _upgrade_replayed = False
    # Answered 503 at its start, past max_connections (`_turn_away`): none of uvicorn's state is
    # made; the timer that closes it, where it lingers.
    _turned_away = False
    _linger_close: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # One compare on every connection's way (uvicorn's set of them is the listener's).
        if len(self.connections) >= self.max_connections and not self._idle.close_oldest(self.loop.time()):
            self._turn_away(transport)
            return
        # The server's context, before any request's: each request's task starts from a copy.
        self._context = contextvars.copy_context()
        self._raw_transport = transport
        self._disconnect_watches = []
        super().connection_made(HeadHoldingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._header_deadline = HeaderDeadline(
            self.loop,
            transport,
            self.header_timeout_s,
            self._header_timeout_response,
            self._cross_origins,
        )
        self._header_deadline.start(request_begun=False)
        self._idle.add(self, self.loop.time())  # until its first byte

    def _turn_away(self, transport: asyncio.Transport) -> None:
        """Answered 503 server_busy before anything is read, and closed (edge/connection_cap.py):
        never one of uvicorn's connections (a shutdown does not wait for it), nothing parsed. It
        lingers, its end sent after the answer and its client's bytes dropped, until the client
        closes its own (eof_received) or LINGER_S has passed, unless too many linger already."""
        self._turned_away = True
        self._refused = True  # data_received drops what the client sends
        TURNED_AWAY.note(self.loop.time(), len(self.connections), self.max_connections)
        transport.write(self._busy_answer)
        if TURNED_AWAY.linger():
            transport.write_eof()
            self._linger_close = self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """The request's task, in a copy of the connection's context. uvicorn starts a request
        pipelined behind another from that one's last send, in its task, whose context the new task
        copied: the earlier request's id bound (structlog's contextvars, edge/pipeline.py), every
        line the new one wrote before it got its own (a key store's failure, a refusal) named the
        earlier request, an answered 200 that an operator then read as failed."""
        if self.config.reset_contextvars:
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(cycle.run_asgi(app), context=self._context.copy())
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers_pending = True
        self._head_bytes = 0
        self._host_seen = False
        self._coding_seen = False
        self._header_deadline.origin = None
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self._header_deadline.start(request_begun=True)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        if not self._headers_pending:
            # A trailer field (after a chunked body): uvicorn appended it to the request's headers,
            # which the app may already have read, so a key sent as a trailer authenticated the
            # request. RFC 9110 6.5.1: never merged into the headers; nothing here reads trailers.
            return
        lowered = name.lower()
        if lowered == b"host":
            if self._host_seen:
                raise _HostNotOne
            self._host_seen = True
        elif lowered == b"origin" and self._header_deadline.origin is None:  # the first, as the app reads it
            self._header_deadline.origin = value.rstrip(b" \t")  # llhttp keeps trailing whitespace
        elif lowered == b"transfer-encoding":
            self._coding_seen = True
            if any(coding.strip() != b"chunked" for coding in value.lower().split(b",")):
                self._unknown_coding = True
                raise _UnknownTransferCoding
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise _HeadTooLarge

    def send_400_response(self, msg: str) -> None:
        """The parser refused the request (uvicorn's answer is plain text): an error object too,
        after the answers of the requests before it. Written at once behind a request still being
        answered, it went into the middle of that response, and the close cut it short."""
        self._header_deadline.stop()
        if self._refused:
            return
        self._refused = True
        if self._head_too_large:
            kind = _HEAD_TOO_LARGE
        elif self._unknown_coding:
            kind = _UNKNOWN_TRANSFER_CODING
        elif self._version_unsupported:
            kind = _VERSION_NOT_SUPPORTED
        else:
            kind = _INVALID_HTTP
        # Counted and logged now, under its id, even where its answer waits its turn.
        answer = (self._header_deadline.answer(kind), kind is not _INVALID_HTTP)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not self._headers_pending:
                # In the body of the connection's latest request (bad chunk framing): running, it
                # waits for a body that will never come, so it is answered now, as before; waiting
                # its turn, it never runs.
                if not (self.pipeline and self.pipeline[0][0] is cycle):
                    self._refuse(answer)
                    return
                self.pipeline.popleft()
            self._refusal = answer  # on_response_complete sends it after the last of them
            return
        self._refuse(answer)

    def _refuse(self, answer: tuple[bytes, bool]) -> None:
        """`answer`: its bytes, and whether the connection lingers before it closes (not after a
        400, where the client's further bytes are no request at all)."""
        # Through the head-holding transport: a HEAD response's head, held past its completion
        # (no body write follows it), goes out first, and its close flushes it.
        written, linger = answer
        self.transport.write(written)
        if not linger:
            self.transport.close()
            return
        self._close_lingering()

    def _close_lingering(self) -> None:
        """Closed a moment after the answer, not with it: closed with the client's bytes still
        unread, the socket sends a reset, which can reach the client before the answer and destroy
        it. Meanwhile what it sends is read and dropped."""
        self._refused = True
        self.loop.call_later(_LINGER_S, self.transport.close)

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn's warning (with advice to install a WebSocket library) at every upgrade request
        and every read after one: the edge answers them as HTTP on purpose (on_headers_complete)."""

    def data_received(self, data: bytes) -> None:
        self._idle.discard(self)
        if self._refused:
            return  # the rest of a refused request, read and dropped until the connection closes
        self._parse(data)
        # Blank lines between requests begin none (llhttp skips them) but cancel uvicorn's
        # keep-alive timer: without a deadline a trickle of them held the connection for ever.
        cycle = self.cycle
        if (
            (cycle is None or cycle.response_complete)
            and self.timeout_keep_alive_task is None
            and not self._refused
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            self._header_deadline.start(request_begun=self._headers_pending)

    def _parse(self, data: bytes) -> None:
        """uvicorn's data_received, but a request that asked for an upgrade is read as the HTTP it
        is answered as. httptools takes any request with Upgrade and `Connection: upgrade` to end at
        its headers, body and all: `curl --http2` to an http:// URL asks for h2c on its first
        request, and a chat's body was skipped (the app read an empty one: a 400 for its JSON).
        Here the parse stops there (on_headers_complete starts no request) and a fresh parser reads
        the request again, from its head less the Upgrade header, and its body from the bytes after."""
        self._unset_keepalive_if_required()
        # A loop, not a call for each request read again: 1,500 of them in one read (90 KB) went
        # past the recursion limit.
        while True:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                # Not uvicorn's warning besides: the refusal's own line (info, the client's doing) says it.
                self.send_400_response("Invalid HTTP request received.")
            except httptools.HttpParserUpgrade as upgrade:
                head, self._upgrade_head = self._upgrade_head, None
                # Closing (past MAX_PIPELINED): no request after it is answered, so none is read
                # again (each such read copies the rest of the bytes).
                if head is not None and not self.transport.is_closing():
                    self.parser = httptools.HttpRequestParser(self)
                    self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's
                    self._upgrade_replayed = True
                    data = head + data[upgrade.args[0] :]
                    continue
            return

    def on_headers_complete(self) -> None:
        self._header_deadline.stop()
        version = self.parser.get_http_version()
        if version not in _SERVED_VERSIONS:
            self._version_unsupported = version != "0.9"
            raise _VersionNotServed
        if not self._host_seen and version == "1.1":
            raise _HostNotOne
        if self._coding_seen and version == "1.0":
            raise _TransferCodingInOldVersion
        if self.parser.should_upgrade():
            if self._upgrade_replayed:
                raise _UpgradeAgain
            # No request yet: the parser skips its body and stops here (_parse reads it again).
            fields = b"".join(
                name + b": " + value + b"\r\n" for name, value in self.headers if name != b"upgrade"
            )
            self._upgrade_head = b"%b %b HTTP/%b\r\n%b\r\n" % (
                self.parser.get_method(),
                self.url,
                version.encode("ascii"),
                fields,
            )
            return
        # Pending until uvicorn took them: its parse of the URL can still refuse the request, which
        # is then a request of its own, answered in its turn (send_400_response).
        super().on_headers_complete()
        self._headers_pending = False
        upgrade, self._upgrade_replayed = self._upgrade_replayed, False
        cycle = self.cycle
        # Not on an upgrade (no new cycle for this scope): the writer belongs to this request's cycle.
        if cycle is not None and cycle.scope is self.scope:
            # HTTP/1.0 has no chunked coding (RFC 9112 7.1): a body of unknown length ends at the
            # close (0.9, the other, is refused at its headers).
            if self.scope["http_version"] == "1.0":
                # Before its task's first step, which takes the send from the cycle.
                cycle.__class__ = UntilCloseCycle
                cycle.keep_alive = False  # the close ends the body
                # RFC 9110 10.1.1, 15.2: its 100-continue is ignored, and no 1xx goes to a 1.0
                # client (it reads the first status line as its answer: a 100, the answer its body).
                cycle.waiting_for_100_continue = False
            elif cycle.waiting_for_100_continue:
                cycle.__class__ = ExpectingCycle  # edge/expect_continue.py
            if upgrade:
                # Answered as plain HTTP (no WebSocket here, edge/server.py), and the connection
                # closes after it: a proxy in front that took the upgrade for made would pass
                # whatever the client sends next, unchecked, as a tunnel's bytes.
                cycle.keep_alive = False
            writer = BodyChunkWriter(cycle, self._raw_transport.write)
            self.scope[WRITE_NOW] = writer.write_now  # type: ignore[literal-required]
            watch = DisconnectWatch(cycle)
            self._disconnect_watches.append(watch)
            self.scope[DISCONNECT_WATCH] = watch  # type: ignore[literal-required]
            if len(self.pipeline) > MAX_PIPELINED:
                # Cut now, as at a hang-up: what runs stops and writes nothing more (into the
                # closing transport, which raises), and what waits never starts.
                for each in self._disconnect_watches:
                    each.connection_lost()
                self.transport.close()
            elif self.pipeline:
                # Queued behind a running request, uvicorn paused the reading for it: read on, so
                # a client that hangs up is seen (connection_lost) while the request ahead runs.
                self.flow.resume_reading()

    def on_message_complete(self) -> None:
        if self._upgrade_head is not None:
            return  # the end the parser gave a request that asked for an upgrade: it has none yet
        super().on_message_complete()

    def on_response_complete(self) -> None:
        queued = bool(self.pipeline)  # a request whose headers came runs now (uvicorn starts it)
        super().on_response_complete()
        cycle = self.cycle
        if isinstance(cycle, ExpectingCycle) and cycle.body_refused:
            # Its answer said `connection: close`: the body it never sent is not waited for.
            if not self.transport.is_closing():
                self._close_lingering()
            return
        self._disconnect_watches = [w for w in self._disconnect_watches if w.pending()]
        # A refused request's answer, once every request before it is answered (send_400_response).
        if self._refusal is not None and not queued and not self.transport.is_closing():
            answer, self._refusal = self._refusal, None
            self._refuse(answer)
            return
        # A request pipelined behind this response began while it was written, when its headers
        # were not timed (a 408 then would cut that response): their deadline runs from now, or a
        # client trickling them would hold the connection for ever (its bytes cancel uvicorn's
        # keep-alive timer). Not while a request queued before it runs: its 408 would cut that
        # one's response; it starts when the last of those ends.
        if self._headers_pending and not queued and not self.transport.is_closing():
            self._header_deadline.start(request_begun=True)
        # Answered before its body was all read (a 401, a 413, a busy 429): the rest of the body
        # has until the same deadline, then the connection closes. Its bytes cancel uvicorn's
        # keep-alive timer and no body timeout runs once the request is answered, so a client
        # trickling them held the connection (its file descriptor) for ever, with no key needed.
        if (
            cycle is not None
            and cycle.response_complete
            and cycle.more_body
            and not self.transport.is_closing()
        ):
            self._header_deadline.start(request_begun=False)
        elif self.timeout_keep_alive_task is not None and not self._headers_pending:
            # Kept alive with nothing of a next request read (uvicorn's timer runs only then).
            self._idle.add(self, self.loop.time())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._turned_away:
            if self._linger_close is not None:
                self._linger_close.cancel()
                TURNED_AWAY.lingered()
            return
        super().connection_lost(exc)
        self._idle.discard(self)
        self._header_deadline.stop()
        # Every unfinished cycle's watch: uvicorn marks only its latest cycle disconnected, and
        # with a request pipelined behind a stream that is the waiting one, while the stream's
        # next write failed on the closed transport (an upstream error, where the client left).
        for watch in self._disconnect_watches:
            watch.connection_lost()
        self._disconnect_watches = []


def edge_http_protocol(
    header_timeout_s: float,
    cors_allow_origins: Sequence[str],
    max_connections: int | None = None,
    idle_reclaim_after_s: float = 1.0,
) -> type[EdgeHttpProtocol]:
    """The protocol class for one server's settings (uvicorn takes a class and builds it itself).
    `max_connections`: None, no cap (an unlimited open-file limit); `idle_reclaim_after_s`: how long
    a connection is idle before one at the cap may take its place."""
    cross_origins = CrossOrigins(cors_allow_origins)
    return type(
        "EdgeHttpProtocol",
        (EdgeHttpProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "max_connections": sys.maxsize if max_connections is None else max_connections,
            "_idle": IdleConnections(idle_reclaim_after_s),
            "_header_timeout_response": timeout_response(header_timeout_s),
            "_cross_origins": cross_origins,
            "_busy_answer": busy_answer(cross_origins.refusal_lines(None)),
        },
    )


def operator_protocol(public: type[EdgeHttpProtocol]) -> type[EdgeHttpProtocol]:
    """The operator listener's protocol (edge/server.py): the public one's, with connections of its
    own: at most OPS_MAX_CONNECTIONS, out of the descriptors' reserve, and its own idle ones, so that
    neither listener closes the other's for a client of its own. Built from the public class, it had
    the public cap, and a connection taken at one listener's cap could be the other's."""
    return type(
        "OperatorHttpProtocol",
        (public,),
        {
            "max_connections": min(public.max_connections, OPS_MAX_CONNECTIONS),
            "_idle": IdleConnections(public._idle.after_s),
        },
    )
