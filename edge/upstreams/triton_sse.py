"""Triton's HTTP `generate_stream`, read straight off the socket: one keep-alive HTTP/1.1 connection
per open stream, every Triton response parsed in the read that brings it. The same connections
carry the replica's polls (readiness, the metrics page) as plain GETs.

Why not gRPC's `ModelStreamInfer` (what the edge used before): every token is one gRPC message, and
grpc.aio spends its per-message machinery on each (its poller thread, a loop wake-up, a future, a
protobuf): the edge's CPU per token through Triton was 9-20x its figure in front of a zero-cost
upstream, and no gRPC client tried did better (docs/bench-triton.md). Why not httpx: its per-line
iteration cost as much as gRPC. Here the response is parsed by httptools (the C parser uvicorn uses)
inside the protocol's `data_received`, each server-sent event (one Triton response) is decoded by
msgspec into the four fields the edge reads, and everything one read brings is handed over at once:
to the relay's `offer` (edge/upstreams/direct.py) when it can take the tokens, so the stream's task
sleeps on, every stream a loop pass's reads fed in one callback (`_RelayBatch`); else to the
stream's reader, woken once per read. When the edge falls behind, the kernel's socket buffer
gathers a stream's responses and one read takes them all.

The end of the HTTP response is the end of the generation (Triton closes the chunked body on the
response flagged final); an error event, a status other than 200, or a connection lost before that
end are failures the caller classifies (gpu_container/triton/refusals.py).

The polls once went through httpx: 1.4 ms of the edge's CPU per GET on a 2-core Xeon, 4.5 ms a
second per replica for its readiness (two GETs) and capacity (one), which a fleet of replicas
multiplies; a GET here costs a small fraction of that (docs/bench-triton.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import weakref
from collections.abc import Callable, Sequence
from typing import cast

import httptools
import msgspec
import structlog

from edge.upstreams.base import Delta, UpstreamError
from edge.writes_together import writes_together

log = structlog.get_logger(__name__)

# How many idle keep-alive connections a replica's pool keeps for the next streams.
MAX_IDLE = 512
# How long closing a pool waits for its idle sockets to be closed (one turn of the loop, normally).
CLOSE_WAIT_S = 1.0


class Event(msgspec.Struct):
    """The fields of one Triton response the edge reads; the rest of the event is skipped."""

    # Triton writes a one-element tensor as a bare number, a longer one as a flat list.
    output_ids: int | list[int] = []
    sequence_length: int | None = None
    kv_cache_reused_blocks: int | None = None
    error: str | None = None


_decode_event = msgspec.json.Decoder(Event).decode


def event_tokens(event: Event) -> list[int]:
    """The response's new token ids (beam 0): `sequence_length` bounds them when it is sent."""
    ids = event.output_ids
    tokens = [ids] if isinstance(ids, int) else ids
    length = event.sequence_length
    if length is not None and 0 <= length < len(tokens):
        tokens = tokens[:length]
    return tokens


class SseConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to a replica carrying one request at a time: a `generate_stream`
    (its events parsed as they come) or a plain GET (its body kept whole, in `body`).

    State of the request in flight: `tokens` received and not yet taken, `declined` (a delta the
    relay's `offer` left to the reader), `reused_blocks` (the first response's prefix-cache hit),
    `failure`, `ended` (the response is complete), `last_activity` (loop time of the last read).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.tokens: list[int] = []
        # Every token of the response so far, and its last, however each reached the edge.
        self.received = 0
        self.last_token: int | None = None
        self.declined: Delta | None = None
        self.reused_blocks: int | None = None
        self.failure: str | None = None
        # The relay's own failure in `offer` (the replica is fine: its sequence must still stop).
        self.relay_error: Exception | None = None
        self.status = 0
        # The failure is the model's own error, sent as an event: Triton's HTTP status for it says
        # nothing of its code (gpu_container/triton/refusals.py).
        self.model_error = False
        # The failure is the edge's verdict (`fail`), not anything the replica sent or did to the
        # connection: no retry on a fresh connection.
        self.judged = False
        self.ended = False
        self.responded = False
        self.reused = False
        self.closed = False
        self.last_activity = 0.0
        self._offer: Callable[[Delta], bool] | None = None
        # The edge's id of the request in flight, and the context it was sent in (its request_id,
        # user and tier bound by the pipeline): the relay runs in a context of its own
        # (`_RelayBatch`), where none is bound, so its log lines are written in this one. With the
        # id alone its line named no user or tier, where every other line the request caused did.
        self.request_id: str | None = None
        self.log_context = contextvars.Context()
        self._waiter: asyncio.Future[None] | None = None
        # The silence watch: one timer per request, moved on only when it fires (a timeout context
        # per wait cost ~8 % of the loop's time at 64 streams).
        self._timeout_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._silent = False
        self._parser = httptools.HttpResponseParser(self)
        self._buffer = b""
        self._events = True
        # The body is server-sent events to parse (a 200 to a `generate_stream`), else kept whole.
        self._sse = False
        self.body = b""
        self._keep_alive = False
        self._loop = asyncio.get_running_loop()
        self._batch = _batch_of(self._loop)
        # Done once the socket is closed: an abort only schedules that for the loop's next turn.
        self.lost: asyncio.Future[None] = self._loop.create_future()

    # -- the request ------------------------------------------------------------------------

    def send(
        self,
        request: bytes,
        offer: Callable[[Delta], bool] | None,
        *,
        events: bool = True,
        request_id: str | None = None,
    ) -> None:
        """Start a request on this idle connection; `offer` is handed tokens where they arrive.
        `events`: the answer is a stream of server-sent events (else a body read whole).
        `request_id`: the edge's request this is for (none for a plain GET)."""
        self.request_id = request_id
        self.log_context = contextvars.copy_context()
        self.tokens, self.declined, self.reused_blocks, self.failure = [], None, None, None
        self.received, self.last_token, self.relay_error = 0, None, None
        self.status, self.ended, self.responded, self._silent = 0, False, False, False
        self.model_error = self.judged = False
        self._offer, self._buffer, self.body, self._events = offer, b"", b"", events
        self._parser = httptools.HttpResponseParser(self)
        self.last_activity = self._loop.time()
        assert self.transport is not None
        self.transport.write(request)

    @property
    def reusable(self) -> bool:
        return self.ended and self._keep_alive and not self.closed and self.failure is None

    def detach(self) -> None:
        """Offer nothing more to the relay: its stream is over, and whoever still reads the
        connection (a `stop` watching for the request's first answer) takes what comes."""
        self._offer = None

    def fail(self, message: str) -> None:
        """End the request in flight with `message` as its failure, now: its reader raises it, and
        the connection is dropped (the replica can no longer answer it). A response already whole
        is left as it is: its reader, away meanwhile (relaying a delta), ends it as served."""
        if self.ended:
            return
        self.judged = True
        self._fail(message)
        self._wake()

    def abort(self) -> None:
        """Drop the connection mid-response (Triton cancels the request when it next writes)."""
        self._stop_timer()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def wait(self, timeout_s: float) -> None:
        """Until something is left for the reader (tokens, a declined delta, the end, a failure).

        Raises TimeoutError after `timeout_s` without a read: tokens the relay took in `offer`
        count as activity though they never wake the reader."""
        if timeout_s != self._timeout_s:
            self._stop_timer()  # armed for the other timeout (the first response's)
            self._timeout_s = timeout_s
            self._silent = self._silent and self._loop.time() >= self.last_activity + timeout_s
        while not self._for_reader():
            if self._silent:
                raise TimeoutError
            if self._timer is None:
                self._timer = self._loop.call_at(self.last_activity + timeout_s, self._check_silence)
            waiter = self._loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    def _check_silence(self) -> None:
        deadline = self.last_activity + self._timeout_s
        if self.ended or self.failure is not None or self.closed:
            self._timer = None
        elif self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._check_silence)
        else:
            self._timer = None
            self._silent = True
            self._wake()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.last_activity = self._loop.time()
        self._silent = False
        self.responded = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"not an HTTP/1.1 answer ({exc}): is this Triton's HTTP port?")
        tokens = self.tokens
        if (
            tokens
            and self._offer is not None
            and self._reader_waits()
            and self.declined is None
            and not self.ended
            and self.failure is None
            and self.relay_error is None
            # The first tokens go to the reader, which reports the prefix-cache hit with them.
            and self.received > len(tokens)
        ):
            self._batch.add(self, self._loop)
        elif self._for_reader():
            self._wake()

    def relay(self) -> None:
        """Offer the tokens this loop pass's reads brought to the relay (`_RelayBatch`, which turns
        a failure here into the stream's); what it declines wakes the reader.

        Checked again here only what can change between the read and this callback: the reader
        may have taken the tokens or been woken (a silence), the connection may have been lost or
        aborted (its stream's task cancelled). The rest is set by reads, one per pass, or by this
        callback."""
        tokens = self.tokens
        offer = self._offer
        if not tokens or offer is None or self.closed or self.failure is not None or not self._reader_waits():
            if self._for_reader():
                self._wake()
            return
        delta = Delta(tokens)
        self.tokens = []
        if offer(delta):
            # Taken: nothing is left for the reader, which sleeps on. Waking it for nothing would
            # cost every such token a step of its task (its future, its callback, five frames
            # resumed).
            return
        self.declined = delta
        self._wake()

    def relay_failed(self, exc: Exception) -> None:
        """The relay failed with this stream's tokens: its reader ends the stream with `exc`."""
        self.relay_error = exc
        self._wake()

    def _reader_waits(self) -> bool:
        """The stream's reader waits in `wait` with nothing left for it: only then may the relay be
        offered tokens (edge/upstreams/direct.py). Busy with a delta (the relay awaiting the lease's
        store for it, or a slow client's write), it relays that delta after this one: offered
        meanwhile, a later read's tokens went out before it, and were charged to the lease the
        reader was extending, whose grant then fell short of the delta by them, and the reply
        ended with the token budget's marker, its budget far from spent."""
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def _for_reader(self) -> bool:
        return bool(
            self.tokens
            or self.declined is not None
            or self.ended
            or self.failure is not None
            or self.relay_error is not None
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.ended and self.failure is None:
            self.failure = "connection closed before the end of the response"
        self._wake()

    # -- httptools callbacks ----------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._sse = self.status == 200 and self._events

    def on_body(self, body: bytes) -> None:
        if not self._sse:
            self.body += body
            return
        # Triton writes each response as one HTTP chunk, so a chunk is nearly always one whole
        # event of one token: decoded straight away, 0.65 us a token less than the general parse
        # below (docs/bench-streams.md, seventeenth pass). A chunk of several events fails the
        # decode (what follows the first event is no JSON) and takes the general parse.
        if not self._buffer and body.startswith(b"data: ") and body.endswith(b"\n\n"):
            try:
                event = _decode_event(body[6:-2])
            except msgspec.DecodeError:
                pass
            else:
                ids = event.output_ids
                if isinstance(ids, int) and event.error is None and event.sequence_length != 0:
                    if self.reused_blocks is None:
                        self.reused_blocks = event.kv_cache_reused_blocks
                    self.tokens.append(ids)
                    self.received += 1
                    self.last_token = ids
                    return
        self._parse_events(body)

    def _parse_events(self, body: bytes) -> None:
        """Every whole event in what is buffered and `body`; a partial one is kept for the next."""
        if self._buffer:
            body = self._buffer + body
            self._buffer = b""
        # Line by line, each newline found with memchr: an event's JSON holds no raw newline, so
        # the first one after "data: " ends its data, and the blank line after it the event.
        find = body.find
        start = 0
        while (end := find(b"\n", start)) >= 0:
            line = start
            start = end + 1
            if end == line or not body.startswith(b"data: ", line, end):
                continue  # the blank line closing an event, or a field the edge does not read
            try:
                event = _decode_event(body[line + 6 : end])
            except msgspec.DecodeError as exc:
                self.failure = f"unreadable event: {exc}"
                continue
            if event.error is not None:
                self.failure = event.error
                continue
            if self.reused_blocks is None:
                self.reused_blocks = event.kv_cache_reused_blocks
            if tokens := event_tokens(event):
                self.tokens += tokens
                self.received += len(tokens)
                self.last_token = tokens[-1]
        if start < len(body):
            self._buffer = body[start:]

    def on_message_complete(self) -> None:
        self._keep_alive = self._parser.should_keep_alive()
        if self.status != 200 and self._events and self.failure is None:
            self.failure = _error_text(self.body) or f"HTTP {self.status}"
            # Triton's own checks answer plain JSON; a model's error comes as the stream's event.
            self.model_error = self.body.lstrip().startswith(b"data: ")
        self.ended = True
        self._stop_timer()

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
        self.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _RelayBatch:
    """The connections this loop pass's reads brought tokens to, relayed together in one callback
    at the start of the next pass, as the in-process engine's step relays every stream's token.

    Relaying each connection's tokens in its own read callback interleaved the relay's work for
    one stream (lease, detokenizer, event, write) with uvloop's read and the parse of the next, and
    cost more than the same work done for all streams in a row: with one step clock for 200 streams
    at 33 ms, the Triton path's CPU per token was 0.91-0.94x this way (three runs side by side,
    docs/bench-streams.md, seventeenth pass). A token waits for the rest of this pass's reads (a
    few microseconds each) and for what the loop runs before its ready callbacks (timers then due),
    never for a timer's delay. Their chunk writes are held and written in a row
    (edge/writes_together.py).
    """

    def __init__(self) -> None:
        # No reference to the loop: the batch is the value of a weak mapping keyed by it.
        self._ready: list[SseConnection] = []

    def add(self, conn: SseConnection, loop: asyncio.AbstractEventLoop) -> None:
        """Relay `conn` in this pass's callback. Read twice in one pass (uvloop reads a socket once
        per readiness; a test may feed it twice), its second turn finds nothing left to offer."""
        if not self._ready:
            # In a context of its own: a read runs in the context its connection was opened in,
            # which the pool keeps for later streams. In the opening request's (its request_id
            # bound), every later stream's relay there, and each line it logged, named that request.
            loop.call_soon(self._relay, context=contextvars.Context())
        self._ready.append(conn)

    def _relay(self) -> None:
        ready, self._ready = self._ready, []
        writes_together(_relay_each, ready)


def _relay_each(ready: Sequence[SseConnection]) -> None:
    for conn in ready:
        try:
            conn.relay()
        except Exception as exc:
            # Raised to the loop's handler it would strand the pass's other streams, and leave
            # this one waiting for its stall timeout: its reader ends it instead.
            conn.log_context.run(log.exception, "direct_relay_failed", request_id=conn.request_id)
            conn.relay_failed(exc)


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _RelayBatch] = weakref.WeakKeyDictionary()


def _batch_of(loop: asyncio.AbstractEventLoop) -> _RelayBatch:
    batch = _batches.get(loop)
    if batch is None:
        batch = _batches[loop] = _RelayBatch()
    return batch


def _error_text(body: bytes) -> str:
    """Triton's error: a JSON object, or (a model's refusal of a streamed request) an event."""
    text = body.strip().removeprefix(b"data: ")
    try:
        error = _decode_event(text).error
    except msgspec.DecodeError:
        return body.decode(errors="replace")[:500]
    return error or ""


class ConnectionPool:
    """Idle keep-alive connections to one replica's HTTP port, reused by the next streams."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[SseConnection] = []
        self._closed = False
        # Whether connections are kept for reuse: not while the replica is not ready (keep_idle).
        self._keep = True
        self._get_head = f" HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()

    async def connect(self, timeout_s: float, *, fresh: bool = False) -> SseConnection:
        """An idle connection (unless `fresh`), or a new one opened within `timeout_s`; UpstreamError
        when the replica cannot be reached in that time or the pool is closed (a connection opened
        then would never be closed). Unbounded, a replica that drops connection attempts rather
        than refusing them (a terminated instance's address, a dropping security group, a full
        accept queue) held a stream for the kernel's SYN retries, about two minutes, before
        its failover to another replica."""
        if self._closed:
            raise UpstreamError(f"{self.host}:{self.port}: the upstream is closed")
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(SseConnection, self.host, self.port)
        except TimeoutError:
            raise UpstreamError(f"{self.host}:{self.port}: no connection within {timeout_s:g} s") from None
        except OSError as exc:
            raise UpstreamError(f"{self.host}:{self.port}: {exc}") from exc
        return conn

    def release(self, conn: SseConnection) -> None:
        """Keep a connection whose response ended cleanly; drop any other."""
        if conn.reusable and self._keep and len(self._idle) < MAX_IDLE and not self._closed:
            self._idle.append(conn)
        else:
            conn.abort()

    def keep_idle(self, keep: bool) -> None:
        """Whether connections are kept for the next requests once their answers have ended. Not
        while the replica is not ready: a tritonserver told to stop waits, before it exits, until
        every connection to it is closed (or its exit timeout has passed, when it cuts what still
        runs and exits 1), and the idle ones kept here held it that long. The idle ones are closed
        now, and each one whose answer ends from now on as it ends."""
        self._keep = keep
        if not keep:
            idle, self._idle = self._idle, []
            for conn in idle:
                conn.abort()

    async def get(self, path: str, timeout_s: float, *, new: bool = False) -> tuple[int, bytes]:
        """(status, body) of a GET; UpstreamError when the replica does not answer in time.
        `new`: on a connection of its own, closed after (`fetch`)."""
        return await self.fetch(b"GET " + path.encode() + self._get_head, path, timeout_s, new=new)

    async def fetch(
        self, request: bytes, what: str, timeout_s: float, *, new: bool = False
    ) -> tuple[int, bytes]:
        """(status, body) of `request`, its answer read whole (never as events: a `stop` answered
        with tokens is just a body here); UpstreamError naming `what` when the replica does not
        answer in time. `new`: sent on a new connection, closed once answered (not kept: one a
        poll would pile up), for what only a new connection can say: whether the replica still
        takes them (TritonUpstream.ready)."""
        conn = await self.connect(timeout_s, fresh=new)
        for fresh in (False, True):
            if fresh:
                conn = await self.connect(timeout_s, fresh=True)
            conn.send(request, None, events=False)
            try:
                while not conn.ended and conn.failure is None:
                    await conn.wait(timeout_s)
            except BaseException as exc:
                # Its own timeout, or cancelled mid-answer (a health check's own timeout, the
                # poller stopped at shutdown): neither kept nor closed, the connection stayed open
                # for good, and a tritonserver stopped later waited its whole exit timeout for it.
                conn.abort()
                if isinstance(exc, TimeoutError):
                    raise UpstreamError(
                        f"{self.host}:{self.port} {what}: no answer within {timeout_s:g} s"
                    ) from None
                raise
            if conn.failure is None or not conn.reused or conn.responded or fresh:
                break
            # A kept-alive connection the replica had closed while idle: once more on a new one.
        if conn.failure is not None:
            raise UpstreamError(f"{self.host}:{self.port} {what}: {conn.failure}")
        if new:
            conn.abort()
        else:
            self.release(conn)
        return conn.status, conn.body

    async def aclose(self) -> None:
        """Drop the idle connections, and return once their sockets are closed; from now on no
        connection is opened or kept. Those still carrying a stream are closed by their streams.

        Waited for: a tritonserver stopped right after (SIGTERM, as `--triton local` stops it once
        the edge is done) counted a kept-alive connection whose close was still only scheduled,
        and never saw it go: it waited out its whole exit timeout for it and exited 1 without
        unloading its model (3 stops in 10 under load)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()
        if idle:
            await asyncio.wait([conn.lost for conn in idle], timeout=CLOSE_WAIT_S)
