"""One Redis connection whose replies go straight to their callers: the admit's round trip.

The limiter's admit is on every stream's way to its first token, and on Redis it was half of the
server's part of TTFT at the median and two thirds at p99 (bench.ttft_overhead --phases,
docs/bench-streams.md, fourteenth pass). Through redis-py it took three passes of the event loop
after the command: the batch writer task's start, its wake-up when the StreamReader had the reply,
the caller's wake-up when the writer handed the reply over; under load each pass waits behind
whatever else the loop is doing (another stream's set-up, an engine step's token writes). Here a
caller writes its own EVALSHA on the connection (concurrent callers' commands share the socket and
Redis's reads as a pipeline would) and the reply, parsed by hiredis in `data_received`, resolves
the caller's future there: one pass. Measured paired against the batcher path (fourteenth pass):
the admit p50 / p99 0.55x / 0.45-0.53x, the server's first-token time 0.78x / 0.70x, CPU per
stream 0.90x.

The first command of a pass of the loop is written at once (a lone admit, the edge's usual case,
waits for nothing); the others sent in the same pass leave together in one write at its end
(`_flush`, from `call_soon`), so a burst costs two writes (on TLS two records) rather than one
each. Measured closed-loop, 50 callers on one server (bench.limiter's load, alternating): all of a
pass in one write at its end cost 0.85x the CPU of a write each but 0.75x the decisions/s and 2x
the admit p50 (Redis sat idle while the pass went on); this way 0.93x the CPU, the same
decisions/s, admit p50 1.2x.

Replies come back in the order the commands went out, so each pops the oldest waiting future; a
caller that gave up leaves its future there, done, and its reply is dropped when it comes, so the
order holds. A lost connection fails every waiting caller (the scripts may have run) and the next
call opens a new one. Error replies are results, not raised: the caller decides (NOSCRIPT: load
the script and send again; READONLY: let go of the connection).

A reply owed for longer than `answer_timeout_s` (the limiter's bound on a call,
limiter/direct_calls.py) fails its caller with TimeoutError, and every caller behind it, and
closes the connection: replies come in order, so none behind a late one can
come first, and a peer gone without a reset (a host lost mid-failover) would otherwise hold the
connection open until the kernel's retransmission timeout, many minutes on. One timer per
connection keeps that deadline, armed for the oldest reply owed, not one per call: a deadline per
call (`asyncio.timeout` around each) armed and cancelled a timer for every call (on asyncio's own
loop a cancelled one stays on its heap until it would have fired), which at 50 callers was about
half of the limiter's client CPU per decision on asyncio's loop and a sixth to a quarter on uvloop,
the edge's (the twentieth pass, docs/bench-limiter.md).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, RedisError, ResponseError

from limiter.read_only_reply import script_read_only
from limiter.resp import pack_command

CLIENT_NAME = "floodgate-admit"


class RespConnection(asyncio.Protocol):
    def __init__(
        self, answer_timeout_s: float | None = None, on_lost: Callable[[], None] | None = None
    ) -> None:
        self._on_lost = on_lost  # told when the server (or the network) ends the connection, not we
        self._reader = hiredis.Reader()
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._sent_at: deque[float] = deque()  # monotonic time of each waiting caller's send
        self._answer_timeout_s = answer_timeout_s
        self._deadline: asyncio.TimerHandle | None = None  # armed while a reply is owed
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._unsent: list[bytes] = []  # commands of this pass after its first, written by _flush
        self._unsent_calls = 0  # how many commands _unsent holds
        self._corked = False  # this pass has written its first command: the rest wait for _flush
        self.closed = False

    def usable(self) -> bool:
        """Open, and on the running loop (a limiter outliving one loop, as tests' do, reconnects)."""
        return not self.closed and self._loop is asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        lost = not self.closed
        self._fail_all(lambda: RedisConnectionError(f"Connection to Redis lost: {exc!r}"))
        if lost and self._on_lost is not None:
            self._on_lost()

    def _fail_all(self, sent_error: Callable[[], Exception]) -> None:
        """Every waiting caller fails (an exception of its own each): `sent_error()` for a command
        written (it may have run), an error connecting for one that never left (nothing of it ran)."""
        self.closed = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        waiting, self._waiting = self._waiting, deque()
        self._sent_at.clear()
        # The newest _unsent_calls callers' commands were never written: nothing of theirs ran.
        sent = len(waiting) - self._unsent_calls
        self._unsent.clear()
        self._unsent_calls = 0
        for i, answer in enumerate(waiting):
            if answer.done():
                continue
            if i < sent:
                answer.set_exception(sent_error())
            else:
                answer.set_exception(
                    RedisConnectionError("Error connecting to Redis: closed before the write")
                )

    def _check_deadline(self) -> None:
        self._deadline = None
        if not self._sent_at or self.closed or self._answer_timeout_s is None:
            return
        late = time.monotonic() - self._sent_at[0] - self._answer_timeout_s
        if late < 0:
            self._deadline = self._loop.call_later(-late, self._check_deadline)
            return
        bound = self._answer_timeout_s
        self.close()  # before the callers hear of it: `close` skips a connection marked closed
        self._fail_all(lambda: TimeoutError(f"No answer from Redis within {bound:g}s"))

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            if len(self._waiting) <= self._unsent_calls:
                # A reply nobody asked for (no command of a waiting caller went out): the stream
                # is out of step, nothing after it can be trusted. Close; every caller then fails
                # and the next call reconnects.
                self.close()
                return
            answer = self._waiting.popleft()
            self._sent_at.popleft()
            if answer.done():
                continue  # its caller gave up; the reply is dropped and the order holds
            if isinstance(reply, hiredis.ReplyError):
                reply = _error(str(reply))
            answer.set_result(reply)

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        """Write one command; the future resolves to its reply (an error reply as an exception value)."""
        return self.send_many(packed, 1)[0]

    def send_many(self, packed: bytes, count: int) -> list[asyncio.Future[Any]]:
        """Write `count` commands packed together; their replies' futures, in order."""
        if self.closed or self._transport is None:
            # Nothing written: for the limiter that is a call never sent (its _never_sent reads
            # redis-py's wording), not one that may have run.
            raise RedisConnectionError("Error connecting to Redis: the connection closed before the call")
        answers: list[asyncio.Future[Any]] = [self._loop.create_future() for _ in range(count)]
        self._waiting.extend(answers)
        self._sent_at.extend([time.monotonic()] * count)
        if self._deadline is None and self._answer_timeout_s is not None:
            # For the oldest reply owed; when it fires it moves on to the next oldest.
            self._deadline = self._loop.call_later(self._answer_timeout_s, self._check_deadline)
        if self._corked:
            self._unsent.append(packed)
            self._unsent_calls += count
        else:
            self._transport.write(packed)
            self._corked = True
            self._loop.call_soon(self._flush)
        return answers

    def _flush(self) -> None:
        self._corked = False
        if self._unsent and not self.closed and self._transport is not None:
            self._transport.write(b"".join(self._unsent))
            self._unsent.clear()
            self._unsent_calls = 0

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()
        self.closed = True


def _error(message: str) -> ResponseError:
    """An error reply as redis-py's parser types the two the limiter acts on: NOSCRIPT (load the
    script, send again) and READONLY (the server was demoted: limiter/direct_calls.py)."""
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    if message.startswith("READONLY") or script_read_only(message):  # the latter: Redis before 7
        return ReadOnlyError(message)
    return ResponseError(message)


async def open_connection(
    host: str,
    port: int,
    *,
    tls: ssl.SSLContext | None = None,
    username: str | None,
    password: str | None,
    db: int,
    timeout_s: float,
    answer_timeout_s: float | None = None,
    on_lost: Callable[[], None] | None = None,
) -> RespConnection:
    """Connected (over TLS with `tls`, the server's name checked as that context says),
    authenticated, on `db` and named CLIENT_NAME (what `CLIENT LIST` shows), within `timeout_s`,
    the set-up commands in one round trip; from then on each reply owed within `answer_timeout_s`;
    `on_lost` called if the server or the network ends it.
    Any failure is redis-py's "Error connecting" ConnectionError: nothing was sent (the limiter's
    _never_sent)."""
    setup: list[tuple[str, ...]] = []
    if password:
        setup.append(("AUTH", username, password) if username else ("AUTH", password))
    if db:
        setup.append(("SELECT", str(db)))
    setup.append(("CLIENT", "SETNAME", CLIENT_NAME))
    conn: RespConnection | None = None
    try:
        async with asyncio.timeout(timeout_s):
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: RespConnection(answer_timeout_s, on_lost), host, port, ssl=tls
            )
            replies = await asyncio.gather(*(conn.send(pack_command(*words)) for words in setup))
            if errors := [r for r in replies if isinstance(r, Exception)]:
                raise errors[0]
    except (OSError, TimeoutError, ResponseError, RedisConnectionError) as exc:
        if conn is not None:
            conn.close()  # refused or too slow on its set-up: not left open behind us
        raise RedisConnectionError(f"Error connecting to Redis at {host}:{port}: {_cause(exc)}") from exc
    return conn


def _cause(exc: BaseException) -> str:
    """Why the set-up failed, as the operator reads it in `limiter_store_failed`: redis-py 8 writes
    a server's error reply's repr as `server:ResponseError`, its message (WRONGPASS, NOPERM naming
    the command an ACL lacks) left out, so a wrong password and a missing grant read alike. A
    server's error replies never repeat the password sent."""
    if isinstance(exc, RedisError):
        return f"{type(exc).__name__}: {exc}"
    return repr(exc)
