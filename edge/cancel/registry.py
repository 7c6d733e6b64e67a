"""Live requests by id, so a cancel (endpoint or disconnect) reaches the generation that runs it.

`CancelRegistry` is this instance's view. Cross-instance cancel is another `RequestRegistry`
(edge/cancel/shared.py) wrapping it: for an id not live here, it answers from a shared store and
publishes the cancel for the instance that runs it to apply with `cancel_local`. (A cancel that
reached the store first is learnt at the request's end from its lease's settle: OutputLease.settle.)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

from edge.cancel.live import LiveRequest
from edge.cancel.outcome import CancelAnswer, CancelOutcome


class RequestRegistry(Protocol):
    """What the pipeline (register, finish) and the cancel route (cancel) need."""

    def register(self, request_id: str, owner: str) -> LiveRequest:
        """A request admitted (by then a cancel sent to any instance finds it: the first event,
        which hands the client the id, comes after)."""
        ...

    def finish(self, live: LiveRequest) -> None: ...

    async def cancel(self, request_id: str, user: str) -> CancelAnswer: ...


class CancelRegistry:
    """Live requests, plus recently finished ones (bounded, aged out) to answer 409 instead of 404,
    or, for one a cancel ended, CANCELLED again (edge/cancel/live.py)."""

    def __init__(self, finished_capacity: int = 100_000, finished_ttl_s: float = 600.0) -> None:
        self._live: dict[str, LiveRequest] = {}
        # request_id: (owner, whether a cancel ended it, when it finished)
        self._finished: OrderedDict[str, tuple[str, bool, float]] = OrderedDict()
        self._capacity = finished_capacity
        self._ttl = finished_ttl_s

    def register(self, request_id: str, owner: str) -> LiveRequest:
        live = LiveRequest(request_id, owner)
        self._live[request_id] = live
        return live

    def finish(self, live: LiveRequest) -> None:
        self._live.pop(live.request_id, None)
        now = time.monotonic()
        self._finished[live.request_id] = (live.owner, live.cancelled, now)
        while self._finished and (
            len(self._finished) > self._capacity or next(iter(self._finished.values()))[2] < now - self._ttl
        ):
            self._finished.popitem(last=False)

    def cancel_local(self, request_id: str, user: str) -> CancelOutcome:
        live = self._live.get(request_id)
        if live is not None and live.owner == user:
            # Live until finish(), but its outcome may already be decided (see LiveRequest).
            return CancelOutcome.CANCELLED if live.cancel() else CancelOutcome.FINISHED
        done = self._finished.get(request_id)
        if done is not None and done[0] == user:
            return CancelOutcome.CANCELLED if done[1] else CancelOutcome.FINISHED
        return CancelOutcome.NOT_FOUND

    async def cancel(self, request_id: str, user: str) -> CancelAnswer:
        return CancelAnswer(self.cancel_local(request_id, user))

    def running(self) -> list[tuple[str, str]]:
        """(request_id, owner) of each live request."""
        return [(live.request_id, live.owner) for live in self._live.values()]

    def __len__(self) -> int:
        return len(self._live)
