"""A delivery callback's chunk writes, held while it relays and then written in a row.

One callback hands one step's tokens to many streams: the engine process's delivery
(gpu_container/engine/engine_process.py) and the Triton path's relay batch
(edge/upstreams/triton_sse.py), and bench/paced_upstream.py's step in their place. Each stream's
relay detokenizes, charges and frames its token and then writes it to its socket. Held while the
callback relays and written one after another, the same work cost 0.82-0.97x the CPU per token of
each write made in its relay (one step clock for 200 / 1,000 streams at 33 / 500 ms, four
alternating side-by-side runs, both paths; docs/bench-streams.md, eighteenth pass): the kernel's
send path and the relays' Python no longer take turns in the caches. Holding 128 rather than 32
measured the same.

The writes held are flushed every HOLD_MAX (the first streams of a step of thousands wait for 32
relays, not for them all) and when the callback ends, before any other callback runs: a stream's
other writes (its first and last events, a write that waits for a slow reader) go through its task,
which runs later, so each stream's bytes keep their order.

A delivery of one item writes at once: a hold costs 0.95 µs a delivery (a loop of 300,000 on this
instance), which one write cannot earn back (a clock per stream, a wake-up per token).

The hold belongs to the thread that opened it: an event loop in another thread (tests run servers
in threads) writing meanwhile writes at once, as it would without the hold.

A delivery of more than SLICE items is relayed SLICE at a time, one slice a loop pass: between two
slices the loop reads its sockets, so a new request's head, a Redis reply or a cancel waits for one
slice (about 1 ms here), not for a whole step of every open stream. With one step clock for 600
streams at 500 ms a step held the loop 13 ms at p50 (30 at p99), and a request crosses several
passes on its way to its first token; sliced, TTFT p50 0.60x and p99 0.68x, the server's CPU per
admitted stream 1.08x in that churn (within its rounds' spread), steady streams' CPU per token the
same (fourteen alternating rounds, docs/bench-streams.md, twenty-first pass). Slices of 128 were
worse than none: each pass a request crosses waits for one. A token of a later slice waits for what
the loop runs in between, a set-up or two, a small part of a step's interval. The slices of a
loop's deliveries run in the order the deliveries came (a later delivery waits for the slices
before it), so a stream's tokens keep their order.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

Write = Callable[[bytes], object]
T = TypeVar("T")

HOLD_MAX = 32
SLICE = 32


class _Hold:
    __slots__ = ("thread", "writes")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.writes: list[tuple[Write, bytes]] = []


# The hold open now, if any. Read on every token's write (edge/body_chunks.py): a module global is
# a third of a thread-local's cost, and the thread is checked only while a hold is open.
open_hold: _Hold | None = None


def writes_together(deliver: Callable[[Sequence[T]], None], items: Sequence[T]) -> None:
    """`deliver(items)`, its chunk writes (edge/body_chunks.py) held and written in a row when
    there are several items; on an event loop, SLICE items a pass, after the slices of the loop's
    earlier deliveries. Inside another hold (or while another thread's is open) `deliver` runs at
    once and writes as it would without one."""
    if open_hold is not None:
        deliver(items)
        return
    if _waiting:  # some loop has slices to run (looking the loop up costs a getpid on 3.11)
        loop = asyncio._get_running_loop()
        later = _later.get(loop) if loop is not None else None
        if loop is not None and later is not None and later.queue:
            later.add(loop, deliver, items, 0)
            return
        _forget_closed_loops()
    if len(items) < 2:
        deliver(items)
        return
    if len(items) <= SLICE or (loop := asyncio._get_running_loop()) is None:
        _held(deliver, items)
        return
    later = _later.get(loop)
    if later is None:
        later = _later[loop] = _Later(loop)
    later.add(loop, deliver, items, SLICE)
    _held(deliver, items[:SLICE])


def _held(deliver: Callable[[Sequence[T]], None], items: Sequence[T]) -> None:
    global open_hold
    open_hold = hold = _Hold()
    try:
        deliver(items)
    finally:
        open_hold = None
        _flush(hold.writes)


class _Later:
    """One loop's deliveries past their first slice, in the order they came: one slice a pass."""

    __slots__ = ("loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = weakref.ref(loop)
        self.queue: deque[tuple[Callable[[Sequence[Any]], None], Sequence[Any], int]] = deque()

    def add(
        self,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[Sequence[T]], None],
        items: Sequence[T],
        start: int,
    ) -> None:
        if not self.queue:
            _waiting.add(self)
            loop.call_soon(self._next, loop)
        self.queue.append((deliver, items, start))

    def _next(self, loop: asyncio.AbstractEventLoop) -> None:
        queue = self.queue
        deliver, items, start = queue[0]
        end = start + SLICE
        if end < len(items):
            queue[0] = (deliver, items, end)
        else:
            queue.popleft()
        try:
            # A slice that raises goes to the loop's handler as a whole delivery would; the
            # slices after it still run.
            _held(deliver, items[start:end])
        finally:
            if queue:
                loop.call_soon(self._next, loop)
            else:
                _waiting.discard(self)


# The _Later of every loop with slices to run (a set's add and discard are atomic under the GIL):
# while it is empty, a delivery need not look its loop up.
_waiting: set[_Later] = set()

# Keyed by the loop and never holding it (only a scheduled pass does; a _Later holds it weakly): a
# loop closed with slices left drops them with itself, and the next delivery its _Later from _waiting.
_later: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Later] = weakref.WeakKeyDictionary()


def _forget_closed_loops() -> None:
    """Drop the _Later of each loop closed (or gone) with slices left: its passes will never run,
    and kept it would make every later delivery look its loop up. Only a delivery that found some
    _Later waiting but none of its own loop's calls this: never in a server's one loop."""
    for later in list(_waiting):  # a copy: another thread's loop may add or discard meanwhile
        loop = later.loop()
        if loop is None or loop.is_closed():
            _waiting.discard(later)
            later.queue.clear()


def write(writer: Write, chunk: bytes) -> None:
    """`writer(chunk)` now, or when this thread's open hold is flushed."""
    hold = open_hold
    if hold is None or hold.thread != threading.get_ident():
        writer(chunk)
        return
    writes = hold.writes
    writes.append((writer, chunk))
    if len(writes) >= HOLD_MAX:
        hold.writes = []
        _flush(writes)


def _flush(writes: list[tuple[Write, bytes]]) -> None:
    """Every write, even past one that raised. A flush runs inside some relay or at a delivery's
    end: an error raised there would fail another stream's relay or cut the rest of the delivery
    short. A transport that refuses a write is a client gone (uvloop closes it on a send error), which
    its stream learns from the connection's loss; the error is logged here and goes no further."""
    for writer, chunk in writes:
        try:
            writer(chunk)
        except Exception:
            log.exception("held_write_failed")
