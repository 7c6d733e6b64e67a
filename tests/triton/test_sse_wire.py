"""The edge's reading of Triton's HTTP `generate_stream` at the byte level, against small servers
that answer as Triton does but misbehave on purpose: a kept-alive connection closed while idle, an
event cut across reads, a replica that streams slowly to a relay taking every token in `offer`,
one that goes silent, and a port that does not speak HTTP/1.1 (the real tritonserver's gRPC port)."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
import structlog

from edge import writes_together
from edge.upstreams import triton_sse
from edge.upstreams.base import Delta, GenerationRequest, UpstreamError
from edge.upstreams.triton import TritonUpstream
from edge.upstreams.triton_sse import SseConnection
from tests.triton.conftest import LocalTriton

WAIT_S = 20.0
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
)

Answer = Callable[[asyncio.StreamWriter, int], Awaitable[None]]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(*tokens: int) -> bytes:
    ids = str(tokens[0]) if len(tokens) == 1 else str(list(tokens)).replace(" ", "")
    return b'data: {"id":"r","model_name":"tensorrt_llm","output_ids":%s,"sequence_length":%d}\n\n' % (
        ids.encode(),
        len(tokens),
    )


END = b"0\r\n\r\n"


async def _read_request(reader: asyncio.StreamReader) -> bool:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    lengths = [int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length")]
    length = lengths[0] if lengths else 0  # a GET has no body
    await reader.readexactly(length)
    return True


class FakeReplica:
    """An HTTP/1.1 server on loopback: `answer(writer, n)` writes the n-th request's response."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self.connections = 0
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeReplica:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await _read_request(reader):
                self.requests += 1
                await self._answer(writer, self.requests)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @asynccontextmanager
    async def upstream(self, **kwargs: float) -> AsyncIterator[TritonUpstream]:
        """The edge's client of this replica, closed on the way out (closing twice is harmless)."""
        url = f"http://127.0.0.1:{self.port}"
        upstream = TritonUpstream("fake", url, f"{url}/metrics", end_id=-1, **kwargs)  # type: ignore[arg-type]
        try:
            yield upstream
        finally:
            await upstream.aclose()


async def _tokens(stream: AsyncIterator[Delta]) -> tuple[list[int], str | None]:
    tokens: list[int] = []
    reason = None
    with anyio.fail_after(WAIT_S):
        async for delta in stream:
            tokens += delta.token_ids
            reason = delta.finish_reason
    return tokens, reason


def _request(n: int = 3) -> GenerationRequest:
    return GenerationRequest(f"req-{n}", [5, 6, 7], max_new_tokens=n, temperature=0.0)


@pytest.mark.anyio
async def test_a_kept_alive_connection_closed_while_idle_is_replaced_before_the_request_fails() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(HEAD + chunk(event(1, 2, 3)) + END)
        await writer.drain()
        writer.close()  # the replica drops the connection the edge keeps for the next stream

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        assert await _tokens(upstream.generate(_request())) == ([1, 2, 3], "length")
        assert await _tokens(upstream.generate(_request())) == ([1, 2, 3], "length")
    assert replica.requests == 2 and replica.connections == 2


@pytest.mark.anyio
async def test_a_poll_on_a_connection_closed_while_idle_is_sent_again_on_a_new_one() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        assert await upstream.ready()  # two GETs: the server's readiness, then the model's
    assert replica.requests == 2 and replica.connections == 2


@pytest.mark.anyio
async def test_a_kept_alive_connection_serves_the_next_stream() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(HEAD + chunk(event(n, n + 1, n + 2)) + END)
        await writer.drain()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        for n in (1, 2, 3):
            assert await _tokens(upstream.generate(_request())) == ([n, n + 1, n + 2], "length")
    assert replica.connections == 1


@pytest.mark.anyio
async def test_events_cut_anywhere_across_reads_arrive_whole() -> None:
    body = HEAD + chunk(event(7)) + chunk(event(8, 9)) + chunk(event(10)) + END

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        for i in range(0, len(body), 5):  # cut inside the head, the chunk sizes and the JSON
            writer.write(body[i : i + 5])
            await writer.drain()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        assert await _tokens(upstream.generate(_request(4))) == ([7, 8, 9, 10], "length")


@pytest.mark.anyio
@pytest.mark.parametrize("cut", [7, None], ids=["cut-reads", "whole-chunks"])
async def test_only_the_tokens_an_event_bounds_count_and_comments_are_skipped(cut: int | None) -> None:
    """`sequence_length` bounds an event's tokens (0: none, even of a bare number), a line that is
    not `data:` is no event, and a chunk may hold several events: all read alike whether reads cut
    the chunks anywhere or bring them whole (the one-event fast path, then the general parse)."""
    body = (
        HEAD
        + chunk(event(7))
        + chunk(b": keep-alive\n\n")
        + chunk(b'data: {"output_ids":99,"sequence_length":0}\n\n')
        + chunk(event(8, 9))
        + chunk(event(20) + event(21))
        + chunk(b'data: {"output_ids":[10,11,12],"sequence_length":2}\n\n')
        + END
    )

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        step = cut or len(body)
        for i in range(0, len(body), step):
            writer.write(body[i : i + step])
            await writer.drain()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        assert await _tokens(upstream.generate(_request(7))) == ([7, 8, 9, 20, 21, 10, 11], "length")


def _paced(count: int, gap_s: float, sent: asyncio.Event) -> Answer:
    """Tokens 100, 101, ... one event and one read each, `gap_s` apart; `sent` set before the end."""

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(HEAD)
        for t in range(count):
            writer.write(chunk(event(100 + t)))
            await writer.drain()
            await asyncio.sleep(gap_s)  # the replica's pace, not synchronisation
        sent.set()
        writer.write(END)
        await writer.drain()

    return answer


def _taking_offer() -> tuple[list[int], Callable[[Delta], bool]]:
    """A relay's `offer` that takes every delta, and the tokens it took."""
    offered: list[int] = []

    def offer(delta: Delta) -> bool:
        offered.extend(delta.token_ids)
        return True

    return offered, offer


@pytest.mark.anyio
async def test_tokens_taken_in_offer_keep_a_slow_stream_from_timing_out() -> None:
    """Past the first token the relay takes every read in `offer`, so the reader never wakes: the
    stream must still not count as silent while tokens arrive, longer than the stall timeout."""
    gap_s, count, stall_s = 0.1, 12, 0.5
    sent = asyncio.Event()
    offered, offer = _taking_offer()
    async with (
        FakeReplica(_paced(count, gap_s, sent)) as replica,
        replica.upstream(stall_timeout_s=stall_s) as upstream,
    ):
        via_reader, reason = await _tokens(upstream.generate_direct(_request(count), offer))
    assert sent.is_set()
    assert reason == "length"
    assert via_reader[:1] == [100]  # the first token goes to the reader (it reports the cache hit)
    assert sorted(via_reader + offered) == list(range(100, 100 + count))
    assert len(offered) >= count - 2, "the relay was offered almost every token"


@pytest.mark.anyio
async def test_tokens_taken_in_offer_leave_the_reader_asleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of `offer`: a token it takes costs no step of the stream's reading task. The
    reader wakes for the first token and the end, not once per read."""
    count = 20
    woken = 0
    wake = SseConnection._wake

    def counting_wake(conn: SseConnection) -> None:
        nonlocal woken
        waiter = conn._waiter
        woken += waiter is not None and not waiter.done()
        wake(conn)

    monkeypatch.setattr(SseConnection, "_wake", counting_wake)
    offered, offer = _taking_offer()
    async with FakeReplica(_paced(count, 0.01, asyncio.Event())) as replica, replica.upstream() as upstream:
        via_reader, reason = await _tokens(upstream.generate_direct(_request(count), offer))
    assert reason == "length"
    assert sorted(via_reader + offered) == list(range(100, 100 + count))
    assert len(offered) >= count - 2
    assert woken <= 3, f"the reader woke {woken} times for {len(offered)} tokens it never saw"


class _Transport:
    """Where an SseConnection fed by hand writes its request: nowhere."""

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None

    def abort(self) -> None:
        pass


def _fed_connection(offer: Callable[[Delta], bool]) -> SseConnection:
    """A connection past its stream's first token (the reader's), fed by hand; its reader is busy
    with that token until `_waiting` starts it waiting for the next."""
    conn = SseConnection()
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    conn.send(b"POST ...", offer)
    conn.data_received(HEAD + chunk(event(7)))
    conn.tokens = []
    return conn


@asynccontextmanager
async def _waiting(*conns: SseConnection) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Each connection's reader waiting for its next delta, as TritonUpstream's does between
    deltas; cancelled on the way out where nothing woke it."""
    readers = [asyncio.create_task(conn.wait(WAIT_S)) for conn in conns]
    await asyncio.sleep(0)  # each reader's first turn, in which it starts to wait
    try:
        yield readers
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


@pytest.mark.anyio
@pytest.mark.parametrize("gone", [False, True], ids=["stream-open", "stream-gone"])
async def test_tokens_of_a_loop_pass_are_offered_after_its_reads_and_never_to_a_stream_gone(
    gone: bool,
) -> None:
    """Tokens that reads bring are offered once the loop's pass of reads is over (every stream's
    relay in one callback), in their order; a stream whose reader gave up in between (its
    connection aborted when its task was cancelled) is offered nothing more."""
    offered, offer = _taking_offer()
    conn = _fed_connection(offer)
    assert offered == [] and conn.received == 1  # the first token was the reader's
    async with _waiting(conn):
        conn.data_received(chunk(event(8)))
        conn.data_received(chunk(event(9, 10)))
        assert offered == []
        if gone:
            conn.abort()
        await asyncio.sleep(0)  # the loop's next pass: one turn, not a wait for time
        assert offered == ([] if gone else [8, 9, 10])


@pytest.mark.anyio
async def test_tokens_read_while_the_reader_is_busy_are_left_to_it_in_their_order() -> None:
    """The relay is offered tokens only while the stream's reader waits for its next delta. Busy
    with one (the relay awaiting the lease's store for it), a later read's tokens went to `offer`:
    written before the delta the reader held, and charged to the lease the reader was extending,
    which then fell short of that delta and ended the reply with the token budget's marker, its
    budget far from spent (`outcome=length` after 112 of 1,000 tokens: three fresh-clone CI runs
    failed on it)."""
    offered, offer = _taking_offer()
    conn = _fed_connection(offer)
    conn.data_received(chunk(event(8)))
    conn.data_received(chunk(event(9, 10)))
    await asyncio.sleep(0)  # the loop's next pass, where a waiting reader's relay would run
    assert offered == []
    async with _waiting(conn) as (reader,):
        # Back to wait, the reader finds them at once, in their order: it never sleeps on them.
        assert reader.done() and conn.tokens == [8, 9, 10]
        conn.tokens = []
    async with _waiting(conn):
        conn.data_received(chunk(event(11)))
        await asyncio.sleep(0)  # the loop's next pass: one turn, not a wait for time
        assert offered == [11]  # waiting with nothing left, the reader leaves them to the relay


def _hit(token: int) -> bytes:
    """A response reporting a prefix-cache hit, as TensorRT-LLM's with return_kv_cache_reuse_stats."""
    return b'data: {"output_ids":%d,"sequence_length":1,"kv_cache_reused_blocks":2}\n\n' % token


@pytest.mark.anyio
@pytest.mark.parametrize("direct", [False, True], ids=["generate", "generate_direct"])
async def test_tokens_read_while_the_first_delta_awaits_the_block_size_are_kept(direct: bool) -> None:
    """The first delta reports the prefix-cache hit in tokens, so the replica's block size is read
    from its metrics page first (once). The rest of the reply and its end, read meanwhile, were
    dropped: the reader took the first tokens before that wait and the end after it. The sleeps
    are the replica's pace: they make the edge read the end during the wait; the test holds
    whatever the order."""
    end_written = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:  # the stream
            writer.write(HEAD + chunk(_hit(1)))
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(chunk(_hit(2)) + chunk(_hit(3)) + END)
            await writer.drain()
            end_written.set()
        else:  # the metrics page the first delta waits for
            await end_written.wait()
            await asyncio.sleep(0.05)
            page = b'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"} 16\n'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))
            await writer.drain()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        req = _request(3)
        stream = upstream.generate_direct(req, lambda delta: False) if direct else upstream.generate(req)
        first = None
        tokens: list[int] = []
        with anyio.fail_after(WAIT_S):
            async for delta in stream:
                first = first or delta
                tokens += delta.token_ids
    assert tokens == [1, 2, 3]
    assert first is not None and first.cached_tokens == 32


@pytest.mark.anyio
async def test_a_delta_the_relay_declined_comes_before_a_failure_read_after_it() -> None:
    """The relay may have counted, charged or written part of a delta it declined (a write left to
    await): the replica's error read before the reader's turn was raised first, and that delta,
    charged, never reached the client."""
    offered: list[Delta] = []

    def declining(delta: Delta) -> bool:
        offered.append(delta)
        return False

    conn = SseConnection()
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    upstream = TritonUpstream("fake", "http://127.0.0.1:9", "http://127.0.0.1:9/metrics", end_id=-1)

    async def connect(timeout_s: float, *, fresh: bool = False) -> SseConnection:
        return conn

    upstream._pool.connect = connect  # type: ignore[method-assign]
    upstream._closed = True  # no `stop` to send: there is no replica behind the connection
    deltas = upstream.generate_direct(_request(10), declining)
    reading = asyncio.ensure_future(deltas.__anext__())
    await asyncio.sleep(0)  # the reader's first turn: it sends the request and waits
    conn.data_received(HEAD + chunk(event(1)))
    assert (await reading).token_ids == [1]  # the first token: the reader's
    reading = asyncio.ensure_future(deltas.__anext__())
    await asyncio.sleep(0)  # the reader waits again
    conn.data_received(chunk(event(2)))
    await asyncio.sleep(0)  # the pass's relay: declined, the reader woken (its turn comes next)
    assert [d.token_ids for d in offered] == [[2]]
    conn.data_received(chunk(b'data: {"error":"executor failed"}\n\n'))
    assert await reading is offered[0]
    with pytest.raises(UpstreamError, match="executor failed"):
        await deltas.__anext__()


@pytest.mark.anyio
async def test_a_relay_failing_in_a_pass_fails_its_stream_and_no_other() -> None:
    def failing(delta: Delta) -> bool:
        raise RuntimeError("the client's transport broke")

    offered, offer = _taking_offer()
    broken, fine = _fed_connection(failing), _fed_connection(offer)
    async with _waiting(broken, fine) as (broken_reader, fine_reader):
        broken.data_received(chunk(event(8)))
        fine.data_received(chunk(event(9)))
        await asyncio.sleep(0)  # the loop's next pass: one turn, not a wait for time
        assert offered == [9]
        assert isinstance(broken.relay_error, RuntimeError)  # its reader ends its stream with it
        assert fine.relay_error is None
        await broken_reader  # woken by the failure
        assert not fine_reader.done()


@pytest.mark.anyio
async def test_a_passs_relays_write_their_chunks_together_after_them() -> None:
    """The relays of a pass's streams hold their chunk writes (edge/writes_together.py) until the
    last of them is done; then every stream's chunk goes out, in the relays' order."""
    log: list[str] = []

    def relay_writing(name: str) -> Callable[[Delta], bool]:
        def offer(delta: Delta) -> bool:
            log.append(f"relay {name}")
            writes_together.write(lambda _chunk: log.append(f"write {name}"), b"x")
            return True

        return offer

    first, second = _fed_connection(relay_writing("a")), _fed_connection(relay_writing("b"))
    async with _waiting(first, second):
        first.data_received(chunk(event(8)))
        second.data_received(chunk(event(9)))
        await asyncio.sleep(0)  # the loop's next pass: one turn, not a wait for time
        assert log == ["relay a", "relay b", "write a", "write b"]


@pytest.mark.anyio
async def test_a_replica_silent_mid_stream_fails_the_stream_and_its_stop_gives_up() -> None:
    """The stop sent for the failed stream meets the same silent replica, which answers it with a
    token and nothing more: the stop gives up after its own timeout (a stop's answer once parsed
    as events left its tokens in place, its wait never waited, and the edge's loop spun)."""
    silence = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(HEAD + chunk(event(1)))
        await writer.drain()
        await silence.wait()  # then nothing, until the test ends

    async with (
        FakeReplica(answer) as replica,
        replica.upstream(stall_timeout_s=0.3, probe_timeout_s=0.3) as upstream,
    ):
        try:
            with pytest.raises(UpstreamError, match="no response within"):
                await _tokens(upstream.generate(_request(5)))
            with anyio.fail_after(WAIT_S):
                await upstream.aclose()
            assert replica.requests == 2  # the stream, then its stop
        finally:
            silence.set()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("bad_event", "failure"),
    [
        (b'data: {"error":"engine step failed"}\n\n', "engine step failed"),
        (b'data: {"output_ids":[3,\n\n', "unreadable event"),
    ],
    ids=["error-event", "unreadable-event"],
)
async def test_an_error_or_unreadable_event_mid_stream_is_the_replicas_failure(
    bad_event: bytes, failure: str
) -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(HEAD + chunk(event(1)) + chunk(bad_event) + chunk(event(2)) + END)
        await writer.drain()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        with pytest.raises(UpstreamError, match=failure):
            await _tokens(upstream.generate(_request(5)))


@pytest.mark.anyio
async def test_a_port_that_does_not_speak_http_1_is_named_as_such(local_triton: LocalTriton) -> None:
    """Triton's gRPC port, given where its HTTP port belongs (an old `HOST:8001` spec)."""
    process = local_triton.process
    upstream = TritonUpstream("grpc-port", f"http://{process.grpc_url}", process.metrics_url)
    try:
        with pytest.raises(UpstreamError, match=r"HTTP/1\.1"):
            await _tokens(upstream.generate(_request()))
    finally:
        await upstream.aclose()


@pytest.mark.anyio
async def test_a_closed_upstream_opens_no_connection() -> None:
    """At shutdown the upstreams close first: a health poll or a stream arriving after must not
    open a connection nobody would close."""

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        assert await upstream.ready()
        # Triton's readiness on a connection of its own (TritonUpstream.ready), the model's on a kept one.
        opened = replica.connections
        await upstream.aclose()
        assert not await upstream.ready()
        with pytest.raises(UpstreamError, match="closed"):
            await _tokens(upstream.generate(_request()))
    assert replica.connections == opened


@pytest.mark.anyio
async def test_a_relay_failing_in_offer_ends_its_stream_and_stops_the_sequence() -> None:
    """A bug in the relay's `offer` runs in the connection's callback: it must end that stream at
    once (not after the stall timeout) and still send the replica the sequence's `stop`."""
    first_read, release = asyncio.Event(), asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            writer.write(HEAD + chunk(event(1)))
            await writer.drain()
            await first_read.wait()  # the first token is the reader's; the next goes to `offer`
            writer.write(chunk(event(2)))
            await writer.drain()
            await release.wait()
        else:  # the stop
            writer.write(HEAD + END)
            await writer.drain()

    def broken_offer(delta: Delta) -> bool:
        raise RuntimeError("relay bug")

    async with FakeReplica(answer) as replica, replica.upstream(stall_timeout_s=WAIT_S) as upstream:
        try:
            stream = upstream.generate_direct(_request(5), broken_offer)
            with anyio.fail_after(WAIT_S / 2):
                assert (await stream.__anext__()).token_ids == [1]
                first_read.set()
                with pytest.raises(UpstreamError, match="relay bug"):
                    await stream.__anext__()
            await upstream.aclose()
            assert replica.requests == 2  # the stream, then its stop
        finally:
            release.set()


def test_a_closed_loops_relay_batch_is_not_kept() -> None:
    """The batch of each loop's reads is kept per loop, weakly: a loop closed and dropped (as every
    test's and every `asyncio.run`'s is) takes its batch with it. Asked of this test's own loops: the
    table is the process's, and a server another test file left running in this process (on a loop
    of its own) has its batch there (CI once found one)."""
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def open_one() -> None:
        conn = SseConnection()
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        loops.append(weakref.ref(asyncio.get_running_loop()))

    for _ in range(3):
        asyncio.run(open_one())
    gc.collect()
    assert len(loops) == 3
    assert all(loop() is None for loop in loops)


@pytest.mark.anyio
async def test_a_replica_that_drops_connection_attempts_fails_the_stream_within_its_first_timeout() -> None:
    """A listener that never accepts, its one-deep queue full: the kernel drops further SYNs, as for
    a terminated instance's address. The stream fails (and so may fail over) within its first
    response's timeout, not after the kernel's SYN retries (about two minutes)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    url = f"http://127.0.0.1:{port}"
    upstream = TritonUpstream("dropping", url, f"{url}/metrics", end_id=-1, first_response_timeout_s=0.5)
    try:
        with pytest.raises(UpstreamError, match=r"no connection within 0\.5 s"):
            await _tokens(upstream.generate(_request()))  # WAIT_S bounds the test itself
    finally:
        await upstream.aclose()
        filler.close()
        listener.close()


@pytest.mark.anyio
async def test_a_probe_cancelled_mid_answer_closes_its_connection() -> None:
    """A health check cut by its own timeout (the replica set's), or the poller stopped at shutdown,
    cancels a probe while it waits for the answer: its connection was neither kept nor closed, so
    it stayed open for good (one more per slow check), and a tritonserver stopped later waited its
    whole exit timeout for it and exited 1."""
    closed = asyncio.Event()

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.read()  # until the client closes: b""
        closed.set()
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = triton_sse.ConnectionPool("127.0.0.1", port)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.get("/v2/health/ready", 30.0)
        async with asyncio.timeout(5):
            await closed.wait()
    finally:
        await pool.aclose()
        server.close()


@pytest.mark.anyio
async def test_a_stream_resent_on_a_fresh_connection_keeps_the_first_response_timeout() -> None:
    """The kept-alive connection the replica closed while idle is replaced and the request sent
    again: its first response is still bounded by first_response_timeout_s (what failover before
    the first token waits for), not by the mid-stream stall timeout, which it was (a review)."""
    hang = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            writer.write(HEAD + chunk(event(1, 2, 3)) + END)
            await writer.drain()
        elif n == 2:
            writer.close()  # the kept-alive connection closed as the next request went out
        else:
            await hang.wait()  # the request resent on a fresh connection is never answered

    async with (
        FakeReplica(answer) as replica,
        replica.upstream(first_response_timeout_s=0.3, stall_timeout_s=5.0) as upstream,
    ):
        try:
            assert await _tokens(upstream.generate(_request())) == ([1, 2, 3], "length")
            started = time.monotonic()
            with pytest.raises(UpstreamError, match=r"no response within 0\.3 s"):
                with anyio.fail_after(10):
                    await _tokens(upstream.generate(_request()))
            assert time.monotonic() - started < 2.0
            assert replica.connections == 2 and replica.requests == 3  # resent once, on a fresh one
        finally:
            hang.set()


@pytest.mark.anyio
async def test_a_pause_shorter_than_the_stall_timeout_does_not_fail_the_stream() -> None:
    """The silence watch armed for the first response (first_response_timeout_s) is left running
    while the reader is busy with the first delta (a slow client's write, the lease's store). A
    pause of the replica past that timeout but well within the stall timeout set the stream's
    silent verdict, which nothing cleared: the next wait raised "no response within <stall> s" at
    once, though the replica had paused for a fraction of that and was sending again (a review)."""

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        if n != 1:
            return  # the stop sent for the failed stream
        writer.write(HEAD + chunk(event(1)))
        await writer.drain()
        await asyncio.sleep(0.8)  # a mid-stream pause, well within the stall timeout
        writer.write(chunk(event(2)))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(chunk(event(3)) + END)
        await writer.drain()

    async with (
        FakeReplica(answer) as replica,
        replica.upstream(first_response_timeout_s=0.3, stall_timeout_s=4.0) as upstream,
    ):
        tokens: list[int] = []
        with anyio.fail_after(10):
            async for delta in upstream.generate(_request(3)):
                tokens += delta.token_ids
                if tokens == [1]:
                    await asyncio.sleep(0.5)  # the reader busy with its first delta
        assert tokens == [1, 2, 3]


@pytest.mark.anyio
async def test_a_kept_alive_connection_relays_a_later_stream_outside_the_request_that_opened_it() -> None:
    """A connection's reads run in the context it was opened in, and the pool keeps it for later
    streams. Opened by a request (its request_id bound for every line it logs), each later stream's
    relay in `offer` ran with that request's id, so a line written there (the relay's failure, a
    conversation turn dropped) named a request long over instead of its own."""
    count = 6
    sent = asyncio.Event()

    async def stream(upstream: TritonUpstream, request_id: str) -> list[object]:
        structlog.contextvars.bind_contextvars(request_id=request_id)  # as the pipeline binds it
        seen: list[object] = []

        def offer(delta: Delta) -> bool:
            seen.append(structlog.contextvars.get_contextvars().get("request_id"))
            return True

        await _tokens(upstream.generate_direct(_request(count), offer))
        return seen

    async with FakeReplica(_paced(count, 0.01, sent)) as replica, replica.upstream() as upstream:
        # Each in a task of its own, as each request is.
        await asyncio.create_task(stream(upstream, "chatcmpl-first"))
        later = await asyncio.create_task(stream(upstream, "chatcmpl-later"))
    assert replica.connections == 1, "the later stream reused the first one's connection"
    assert later, "the later stream's relay took tokens in offer"
    assert "chatcmpl-first" not in later, later
