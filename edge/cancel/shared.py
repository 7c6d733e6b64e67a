"""The edge's RequestRegistry for a fleet: this instance's registry, with a cancel bus behind it."""

from __future__ import annotations

from edge.cancel.bus import CancelBus
from edge.cancel.live import LiveRequest
from edge.cancel.outcome import CancelAnswer, CancelOutcome
from edge.cancel.registry import CancelRegistry


class SharedCancelRegistry:
    """The edge's RequestRegistry for a fleet: this instance's CancelRegistry, and a bus for the rest.

    The store needs nothing from this registry while a request runs or when it ends: a request is
    live there from its limiter admit, and its settle marks it done and tells the pipeline whether
    a cancel came first (edge/cancel/bus.py). A cancel is answered locally when the request is
    known here, else by the bus, which also delivers it to the instance that runs it.
    """

    def __init__(self, local: CancelRegistry, bus: CancelBus) -> None:
        self._local = local
        self._bus = bus

    async def start(self) -> None:
        await self._bus.start(self._local.cancel_local, self._local.running)

    async def aclose(self) -> None:
        await self._bus.aclose()

    def register(self, request_id: str, owner: str) -> LiveRequest:
        return self._local.register(request_id, owner)

    def finish(self, live: LiveRequest) -> None:
        self._local.finish(live)

    async def cancel(self, request_id: str, user: str) -> CancelAnswer:
        outcome = self._local.cancel_local(request_id, user)
        if outcome is not CancelOutcome.NOT_FOUND:
            return CancelAnswer(outcome)
        return CancelAnswer(await self._bus.cancel(request_id, user), by_bus=True)
