"""Settles on their way to the shared store: batched, and retried until they land.

A settle frees a concurrency slot. Skipping one because Redis stalled for a moment would leave
the user refused for the slot's whole lifetime (minutes), so a settle that fails stays here and is
sent again once the store's backoff is over, until it lands or its slot has expired on the store
by itself (then there is nothing left to free). Settles are idempotent in the store (settle.lua),
so sending one twice is harmless.

All settles waiting when the writer is free go in one pipelined round trip: under load, settles
cost a fraction of a round trip each. A caller waits for its settle's first attempt only (and not
at all while the store is known down), never for the retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from limiter.metrics import SETTLES_DROPPED, SETTLES_EXPIRED, SETTLES_PENDING
from limiter.store_health import StoreHealth

DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_PENDING = 100_000
# Pause before sending again after a failure the store's health did not turn into a backoff
# (the store was busy rather than down), so a busy store is not hammered in a tight loop.
_BUSY_PAUSE_S = 0.05


@dataclass(slots=True)
class PendingSettle:
    keys: Sequence[str]
    args: Sequence[str | int]
    expires_at: float  # time.monotonic() after which the slot has expired on the store
    attempted: asyncio.Future[None] | None = field(default=None)  # done after the first attempt


SendBatch = Callable[[list[PendingSettle]], Awaitable[bool]]


class SettleQueue:
    def __init__(
        self,
        send: SendBatch,
        health: StoreHealth,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        """`send` sends a batch in one round trip; True when every settle in it landed."""
        self._send = send
        self._health = health
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._pending: deque[PendingSettle] = deque()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, settle: PendingSettle, *, wait: bool = False) -> asyncio.Future[None] | None:
        """Queue a settle; with `wait`, a future done once its first attempt is over."""
        if len(self._pending) >= self._max_pending:
            # Oldest first: it is the nearest to expiring on the store by itself.
            _resolve(self._pending.popleft())
            SETTLES_DROPPED.inc()
        if wait:
            settle.attempted = asyncio.get_running_loop().create_future()
        self._pending.append(settle)
        SETTLES_PENDING.set(len(self._pending))
        self._wake.set()
        if self._writer is None or self._writer.done():
            # A context of its own: it outlives the request that started it, whose id its log lines
            # (a store failing, recovering) carried for the life of the process.
            self._writer = asyncio.create_task(
                self._write(), name="limiter-settles", context=contextvars.Context()
            )
        return settle.attempted

    async def submit(self, settle: PendingSettle) -> None:
        """Queue a settle and wait for its first attempt (not at all while the store is down)."""
        attempted = self.add(settle, wait=self._health.retry_in() == 0)
        if attempted is not None:
            # Shielded: a cancelled caller leaves the settle queued, and the future unharmed.
            await asyncio.shield(attempted)

    async def _write(self) -> None:
        # Stops on `_closing` as well as on cancel: a cancel that lands as a store call's own
        # timeout fires is taken for that timeout (asyncio.timeout in Python 3.11) and lost.
        while not self._closing:
            self._drop_expired()
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            backoff = self._health.retry_in()
            if backoff > 0:
                for settle in self._pending:  # nobody waits out a backoff
                    _resolve(settle)
                await asyncio.sleep(backoff)  # the store's backoff: when it may be tried again
                continue
            batch = [self._pending.popleft() for _ in range(min(self._max_batch, len(self._pending)))]
            try:
                landed = await self._send(batch)
            except asyncio.CancelledError:
                self._pending.extendleft(reversed(batch))  # aclose sends them once more
                raise
            except Exception:  # the sender reports store failures itself; never let one stop us
                landed = False
            for settle in batch:
                _resolve(settle)
            if not landed:
                self._pending.extendleft(reversed(batch))
                if self._health.retry_in() == 0:
                    await asyncio.sleep(_BUSY_PAUSE_S)
            SETTLES_PENDING.set(len(self._pending))

    def _drop_expired(self) -> None:
        now = time.monotonic()
        if not any(settle.expires_at <= now for settle in self._pending):
            return
        kept = [settle for settle in self._pending if settle.expires_at > now]
        SETTLES_EXPIRED.inc(len(self._pending) - len(kept))
        for settle in self._pending:
            if settle.expires_at <= now:
                _resolve(settle)
        self._pending = deque(kept)
        SETTLES_PENDING.set(len(self._pending))

    async def aclose(self) -> None:
        """Stop the writer after one last attempt at whatever is pending (if the store is up)."""
        self._closing = True
        self._wake.set()
        writer, self._writer = self._writer, None
        while writer is not None and not writer.done():
            writer.cancel()
            await asyncio.wait({writer}, timeout=1.0)
        if writer is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                writer.result()
        if self._pending and self._health.retry_in() == 0:
            batch = list(self._pending)
            with contextlib.suppress(Exception):
                if await self._send(batch):
                    self._pending.clear()
        for settle in self._pending:
            _resolve(settle)
        SETTLES_PENDING.set(len(self._pending))


def _resolve(settle: PendingSettle) -> None:
    if settle.attempted is not None and not settle.attempted.done():
        settle.attempted.set_result(None)
