"""A CancelBus for one process, with the same answers as RedisCancelBus: a test double (the edge
itself runs either its own CancelRegistry alone or the Redis bus)."""

from __future__ import annotations

import time
from collections import OrderedDict

from edge.cancel.bus import CANCELLING, LIVE, Deliver
from edge.cancel.outcome import CancelOutcome


class InMemoryCancelBus:
    """One process: the same answers as Redis. Live owners are dropped by end() or finish(), which
    the edge calls for every request; finished ones age out after finished_ttl_s, oldest first."""

    def __init__(self, *, finished_ttl_s: float = 600.0) -> None:
        self._finished_ttl_s = finished_ttl_s
        self._live: dict[str, tuple[str, str]] = {}  # id -> (state: LIVE or CANCELLING, owner)
        self._finished: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (owner, expires at)
        self._deliver: Deliver | None = None

    async def start(self, deliver: Deliver) -> None:
        self._deliver = deliver

    async def track(self, request_id: str, owner: str) -> None:
        self._live[request_id] = (LIVE, owner)

    async def end(self, request_id: str, owner: str) -> bool:
        state, _ = self._live.get(request_id, (LIVE, owner))
        await self.finish(request_id, owner)
        return state == CANCELLING

    async def finish(self, request_id: str, owner: str) -> None:
        self._expire()
        self._live.pop(request_id, None)
        self._finished[request_id] = (owner, time.monotonic() + self._finished_ttl_s)
        self._finished.move_to_end(request_id)

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        self._expire()
        if request_id in self._live and self._live[request_id][1] == user:
            self._live[request_id] = (CANCELLING, user)
            if self._deliver is not None:
                self._deliver(request_id, user)
            return CancelOutcome.CANCELLED
        if request_id in self._finished and self._finished[request_id][0] == user:
            return CancelOutcome.FINISHED
        return CancelOutcome.NOT_FOUND

    async def aclose(self) -> None:
        self._deliver = None

    def _expire(self) -> None:
        now = time.monotonic()
        while self._finished and next(iter(self._finished.values()))[1] <= now:
            self._finished.popitem(last=False)
