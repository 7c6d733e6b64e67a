"""A delivery callback's chunk writes, held while it relays and then written in a row.

One callback hands one step's tokens to many streams: the engine process's delivery
(gpu_container/engine/engine_process.py) and the Triton path's relay batch
(edge/upstreams/triton_sse.py), and bench/paced_upstream.py's step in their place. Each stream's
relay detokenizes, charges and frames its token and then writes it to its socket: interleaved,
each write's trip through the kernel and the next relay's Python evict each other from the caches.
Held while the callback relays and written one after another, each runs warm.

The writes held are flushed every HOLD_MAX (the first streams of a step of thousands wait for 32
relays, not for them all) and when the callback ends, before any other callback runs: a stream's
other writes (its first and last events, a write that waits for a slow reader) go through its task,
which runs later, so each stream's bytes keep their order.

The hold belongs to the thread that opened it: an event loop in another thread (tests run servers
in threads) writing meanwhile writes at once, as it would without the hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Write = Callable[[bytes], object]

HOLD_MAX = 32


class _Hold:
    __slots__ = ("thread", "writes")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.writes: list[tuple[Write, bytes]] = []


# Read on every token's write: a module global is a third of a thread-local's cost, and the thread
# is checked only while a hold is open.
_open: _Hold | None = None


def writes_together(run: Callable[[], None]) -> None:
    """`run()`, its chunk writes (edge/body_chunks.py) held and written in a row. Inside another
    hold (or while another thread's is open) `run` writes as it would without one."""
    global _open
    if _open is not None:
        run()
        return
    _open = hold = _Hold()
    try:
        run()
    finally:
        _open = None
        _flush(hold.writes)


def write(writer: Write, chunk: bytes) -> None:
    """`writer(chunk)` now, or when this thread's open hold is flushed."""
    hold = _open
    if hold is None or hold.thread != threading.get_ident():
        writer(chunk)
        return
    writes = hold.writes
    writes.append((writer, chunk))
    if len(writes) >= HOLD_MAX:
        hold.writes = []
        _flush(writes)


def _flush(writes: list[tuple[Write, bytes]]) -> None:
    """Every write, even past one that raised (it is another stream's); then the first error."""
    error: Exception | None = None
    for writer, chunk in writes:
        try:
            writer(chunk)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error
