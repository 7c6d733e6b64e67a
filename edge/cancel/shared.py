"""The edge's RequestRegistry for a fleet: this instance's registry, mirrored into a cancel bus."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from edge.cancel.bus import CancelBus
from edge.cancel.live import LiveRequest
from edge.cancel.outcome import CancelOutcome
from edge.cancel.registry import CancelRegistry


class SharedCancelRegistry:
    """The edge's RequestRegistry for a fleet: this instance's CancelRegistry, mirrored into a bus.

    register/finish stay synchronous for the pipeline; their store writes run as tasks, the finish of
    a request after its track. `announce` waits for the track (the pipeline awaits it before the
    first event); a store failure there is logged by the bus and the request goes on, cancellable
    on this instance only. A cancel is answered locally when the request is known here, else by
    the bus, which also delivers it to the instance that runs it.
    """

    def __init__(self, local: CancelRegistry, bus: CancelBus) -> None:
        self._local = local
        self._bus = bus
        self._tracking: dict[str, asyncio.Task[None]] = {}
        self._writes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self._bus.start(self._local.cancel_local)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the store writes behind register/finish to complete."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout_s)

    async def aclose(self) -> None:
        await self.drain()
        await self._bus.aclose()

    def register(self, request_id: str, owner: str) -> LiveRequest:
        live = self._local.register(request_id, owner)
        self._tracking[request_id] = self._spawn(self._bus.track(request_id, owner))
        return live

    async def announce(self, live: LiveRequest) -> None:
        tracking = self._tracking.get(live.request_id)
        if tracking is not None:
            # Shielded: a client leaving meanwhile must not cancel the write finish() chains after.
            await asyncio.shield(tracking)

    async def end(self, live: LiveRequest) -> bool:
        """Decided here and in the store: a cancel accepted on this instance (live.end) or on another
        one (the store's record, flipped to done by the same script that reads it) came first."""
        cancelled_here = live.end()
        tracking = self._tracking.get(live.request_id)
        if tracking is not None:
            # The owner record must exist before it is ended (announce usually waited for it).
            await asyncio.shield(tracking)
        cancelled_elsewhere = await self._bus.end(live.request_id, live.owner)
        if cancelled_elsewhere:
            live.cancelled = True
        return cancelled_here or cancelled_elsewhere

    def finish(self, live: LiveRequest) -> None:
        self._local.finish(live)
        self._spawn(self._finish(live.request_id, live.owner, self._tracking.pop(live.request_id, None)))

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        outcome = self._local.cancel_local(request_id, user)
        if outcome is not CancelOutcome.NOT_FOUND:
            return outcome
        return await self._bus.cancel(request_id, user)

    async def _finish(self, request_id: str, owner: str, tracked: asyncio.Task[None] | None) -> None:
        if tracked is not None:
            await tracked
        await self._bus.finish(request_id, owner)

    def _spawn(self, write: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task
