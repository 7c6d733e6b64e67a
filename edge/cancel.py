"""Live requests by id, so a cancel (endpoint or disconnect) reaches the generation that runs it.

`CancelRegistry` is this instance's view. Cross-instance cancel is another `RequestRegistry`
wrapping it: it mirrors register/finish into a shared store (owner, live or finished) and, for an
id not live here, answers from that store and publishes the cancel for the instance that runs it
to apply with `cancel_local`.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from typing import Protocol

import anyio


class CancelOutcome(enum.Enum):
    CANCELLED = "cancelled"
    NOT_FOUND = "not_found"  # unknown here, or another user's
    FINISHED = "finished"


class LiveRequest:
    """A request in flight. Its generation runs inside `scope()`; `cancel` stops it there.

    The contract between a cancel and a generation that ends on its own, strict on the instance
    that runs the request: whichever of `cancel()` and `end()` comes first decides. A cancel before
    `end()` answers CANCELLED and the outcome is cancelled (even if the last token was already
    out: the final chunk carries `"floodgate": {"cancelled": true}`); a cancel after it answers
    FINISHED (409), and the outcome is what the generation said. Both run on the event loop's
    thread, so neither can slip between the other's check and mark.
    """

    __slots__ = ("_scope", "cancelled", "ended", "owner", "request_id")

    def __init__(self, request_id: str, owner: str) -> None:
        self.request_id = request_id
        self.owner = owner
        self.cancelled = False
        self.ended = False
        self._scope: anyio.CancelScope | None = None

    def scope(self) -> anyio.CancelScope:
        """The cancel scope to run the generation in (cancelled at once if a cancel came first)."""
        if self._scope is None:
            self._scope = anyio.CancelScope()
            if self.cancelled:
                self._scope.cancel()
        return self._scope

    def cancel(self) -> bool:
        """Stop the generation; False when it had already ended (the cancel changes nothing)."""
        if self.ended:
            return False
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()
        return True

    def end(self) -> bool:
        """The generation stopped running: its outcome is decided now. True when a cancel came
        first, and the outcome must then be reported as cancelled."""
        self.ended = True
        return self.cancelled


class RequestRegistry(Protocol):
    """What the pipeline (register, finish) and the cancel route (cancel) need."""

    def register(self, request_id: str, owner: str) -> LiveRequest: ...

    async def announce(self, live: LiveRequest) -> None:
        """Returns once a cancel sent to any instance would find the request: the pipeline awaits it
        before the first event, which hands the client the id to cancel with."""
        ...

    def finish(self, live: LiveRequest) -> None: ...

    async def cancel(self, request_id: str, user: str) -> CancelOutcome: ...


class CancelRegistry:
    """Live requests, plus recently finished ones (bounded, aged out) to answer 409 instead of 404."""

    def __init__(self, finished_capacity: int = 100_000, finished_ttl_s: float = 600.0) -> None:
        self._live: dict[str, LiveRequest] = {}
        self._finished: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._capacity = finished_capacity
        self._ttl = finished_ttl_s

    def register(self, request_id: str, owner: str) -> LiveRequest:
        live = LiveRequest(request_id, owner)
        self._live[request_id] = live
        return live

    async def announce(self, live: LiveRequest) -> None:
        """Known here from register() on: nothing to wait for."""

    def finish(self, live: LiveRequest) -> None:
        self._live.pop(live.request_id, None)
        now = time.monotonic()
        self._finished[live.request_id] = (live.owner, now)
        while self._finished and (
            len(self._finished) > self._capacity or next(iter(self._finished.values()))[1] < now - self._ttl
        ):
            self._finished.popitem(last=False)

    def cancel_local(self, request_id: str, user: str) -> CancelOutcome:
        live = self._live.get(request_id)
        if live is not None and live.owner == user:
            # Live until finish(), but its outcome may already be decided (see LiveRequest).
            return CancelOutcome.CANCELLED if live.cancel() else CancelOutcome.FINISHED
        done = self._finished.get(request_id)
        if done is not None and done[0] == user:
            return CancelOutcome.FINISHED
        return CancelOutcome.NOT_FOUND

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        return self.cancel_local(request_id, user)

    def __len__(self) -> int:
        return len(self._live)
