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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog

log = structlog.get_logger(__name__)

Write = Callable[[bytes], object]
T = TypeVar("T")

HOLD_MAX = 32


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
    there are several items. Inside another hold (or while another thread's is open) `deliver`
    writes as it would without one."""
    global open_hold
    if open_hold is not None or len(items) < 2:
        deliver(items)
        return
    open_hold = hold = _Hold()
    try:
        deliver(items)
    finally:
        open_hold = None
        _flush(hold.writes)


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
