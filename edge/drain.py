"""Graceful drain: what this process does between SIGTERM and its exit.

The load balancer must see the instance leave before the instance stops answering, and a stream
cut by a shutdown must still end the way every stream ends (an event, then `[DONE]`, its limits
settled). So a drain has two clocks, both counted from the moment it begins:

* `accept_s` (`[server] drain_accept_s`): the listener keeps accepting connections. `/readyz`
  answers 503 at once, so the load balancer deregisters the instance; requests that still arrive
  meanwhile get 503 with `Retry-After` (another instance will take them) instead of a refused
  connection. Then the listener closes.
* `deadline_s` (`[server] drain_deadline_s`): streams still running then are cut. Each runs inside
  a scope `watch`ed here; the deadline cancels those scopes, and the generation ends its stream with an
  error event (code `server_shutting_down`), its usage and `[DONE]`, and settles its limits.

The server (edge/server.py) begins the drain on SIGTERM and exits once the last stream ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import anyio
import structlog

from edge.metrics import DRAINING

log = structlog.get_logger("floodgate.drain")


class Drain:
    def __init__(self, accept_s: float, deadline_s: float) -> None:
        if accept_s < 0 or deadline_s < 0:
            raise ValueError("drain_accept_s and drain_deadline_s must be >= 0")
        self.accept_s = accept_s
        self.deadline_s = deadline_s
        self._began_at: float | None = None
        self._past_deadline = False
        # For drain_finished: the streams that ended while draining before the cut (on their own,
        # or their client gone), and those the cut (the deadline, or a forced exit) ended.
        self._ended = 0
        self._cut = 0
        self._reported = False
        self._guards: set[anyio.CancelScope] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._on_begin: list[Callable[[], None]] = []
        self._on_cut: list[Callable[[], None]] = []

    def on_begin(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the drain begins (the fleet membership hands its share over)."""
        self._on_begin.append(callback)

    def on_cut(self, callback: Callable[[], None]) -> None:
        """Call `callback` at the cut (the deadline, or a forced exit's), once, on the loop: the
        server then aborts connections whose clients take none of their last events
        (edge/server.py, DrainingServer._abort_unsent)."""
        self._on_cut.append(callback)

    @property
    def draining(self) -> bool:
        return self._began_at is not None

    @property
    def running(self) -> int:
        """Generations watched now (they end by the deadline at the latest)."""
        return len(self._guards)

    def begin(self) -> None:
        """Start draining now (idempotent). Must run on the event loop the streams run on."""
        if self._began_at is not None:
            return
        self._began_at = time.monotonic()
        DRAINING.set(1)
        log.info(
            "drain_started", running=len(self._guards), accept_s=self.accept_s, deadline_s=self.deadline_s
        )
        self._timer = asyncio.get_running_loop().call_later(self.deadline_s, self.cut)
        for callback in self._on_begin:
            callback()

    def cut(self) -> None:
        """The deadline: cancel every watched generation still running (and any that starts later)."""
        first = not self._past_deadline
        self._past_deadline = True
        if first:
            # Counted once: a second cut (a forced exit's) finds these again; those watched from
            # now on are counted in `watch`.
            self._cut += len(self._guards)
            for callback in self._on_cut:
                callback()
        if self._guards:
            log.warning("drain_deadline_cut", streams=len(self._guards))
        for scope in list(self._guards):
            scope.cancel()

    def accept_left_s(self) -> float:
        """How long the listener should keep accepting from now (0 when not draining)."""
        if self._began_at is None:
            return 0.0
        return max(0.0, self._began_at + self.accept_s - time.monotonic())

    @property
    def past_deadline(self) -> bool:
        return self._past_deadline

    def watch(self, scope: anyio.CancelScope) -> None:
        """Cut `scope`, the one a generation runs in, at the deadline (at once if it has passed);
        `unwatch` it when the generation ends. The generation's own scope, not one more of its own:
        a cancel scope per stream is a cost every stream pays (docs/bench-streams.md), and the
        generation tells the two cancellers apart (edge/generation.py)."""
        if self._past_deadline:
            scope.cancel()
            self._cut += 1
        self._guards.add(scope)

    def unwatch(self, scope: anyio.CancelScope) -> None:
        self._guards.discard(scope)
        if self._began_at is not None and not self._past_deadline:
            self._ended += 1

    def close(self) -> None:
        """The app's shutdown, once the server has stopped waiting for its streams: a drain's end.
        `drain_finished` says how it went, which drain_started and drain_deadline_cut alone left to
        be worked out from every stream's line: how many streams ended before the deadline, how
        many it cut, how long it took, and how many still ran (a forced exit's)."""
        if self._began_at is not None and not self._reported:
            self._reported = True  # once, should the shutdown call it again
            log.info(
                "drain_finished",
                streams_ended=self._ended,
                streams_cut=self._cut,
                still_running=len(self._guards),
                duration_s=round(time.monotonic() - self._began_at, 3),
            )
        DRAINING.set(0)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
