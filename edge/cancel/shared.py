"""The edge's RequestRegistry for a fleet: this instance's registry, mirrored into a cancel bus."""

from __future__ import annotations

import asyncio

from edge.cancel.bus import CancelBus
from edge.cancel.live import LiveRequest
from edge.cancel.outcome import CancelOutcome
from edge.cancel.registry import CancelRegistry


class SharedCancelRegistry:
    """The edge's RequestRegistry for a fleet: this instance's CancelRegistry, mirrored into a bus.

    A request is live in the store from its limiter admit (edge/cancel/bus.py), so `register` has
    nothing to write. `end` decides the outcome with the store; `finish` writes only for a request
    whose end did not reach the store, in a task (it stays synchronous for the pipeline). A cancel
    is answered locally when the request is known here, else by the bus, which also delivers it to
    the instance that runs it.
    """

    def __init__(self, local: CancelRegistry, bus: CancelBus) -> None:
        self._local = local
        self._bus = bus
        # Requests whose record the store's end script already marked done.
        self._ended_in_store: set[str] = set()
        self._writes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self._bus.start(self._local.cancel_local)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the store writes behind finish to complete."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout_s)

    async def aclose(self) -> None:
        await self.drain()
        await self._bus.aclose()

    def register(self, request_id: str, owner: str) -> LiveRequest:
        return self._local.register(request_id, owner)

    async def end(self, live: LiveRequest) -> bool:
        """Decided here and in the store: a cancel accepted on this instance (live.end) or on another
        one (the store's record, flipped to done by the same script that reads it) came first."""
        cancelled_here = live.end()
        cancelled_elsewhere = await self._bus.end(live.request_id, live.owner)
        if cancelled_elsewhere is not None:
            self._ended_in_store.add(live.request_id)
        if cancelled_elsewhere:
            live.cancelled = True
        return cancelled_here or bool(cancelled_elsewhere)

    def finish(self, live: LiveRequest) -> None:
        self._local.finish(live)
        if live.request_id in self._ended_in_store:
            self._ended_in_store.discard(live.request_id)
            return
        task = asyncio.get_running_loop().create_task(self._bus.finish(live.request_id, live.owner))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        outcome = self._local.cancel_local(request_id, user)
        if outcome is not CancelOutcome.NOT_FOUND:
            return outcome
        return await self._bus.cancel(request_id, user)
