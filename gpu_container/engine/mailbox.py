"""One request's outputs, carried from the engine's thread (or process reader) to its event loop as
the seam's deltas (gpu_container/contract.py).

Each output becomes a `Delta` once, on the loop, where it arrives; one carrying an error fails the
stream (take raises UpstreamError). The consumer drains everything that piled up since it last
looked, so a lagging consumer gets several steps' tokens in one delta instead of falling further
behind.

While the consumer waits in `take` with nothing pending, a delta may be offered to `offer` instead
(the edge's direct relay, edge/upstreams/direct.py): the engine process hands a whole step's
outputs to the loop in one callback, and a token the edge relays right there wakes no task.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

import structlog

from gpu_container.contract import Delta, UpstreamError
from gpu_container.engine.types import TokenOutput

log = structlog.get_logger(__name__)

# Takes a delta while the consumer waits (True: relayed, not to be delivered again).
Offer = Callable[[Delta], bool]


class Mailbox:
    """Filled from the engine thread (post) or, by the engine process's reader, already on the loop
    (put). An exception posted instead (a request the engine process refused) is raised by take.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_orphaned: Callable[[], None] = lambda: None
    ) -> None:
        self.loop = loop
        self._on_orphaned = on_orphaned
        self._pending: list[Delta] = []
        self._error: Exception | None = None
        # What `take` waits on while nothing is pending (done once something is, or when cancelled).
        self._waiter: asyncio.Future[None] | None = None
        # The delta `offer` declined, which `take` hands over alone and as it is: the edge may have
        # relayed part of it already (a write left to await, a stop string found) and knows it by
        # identity (edge/token_relay.py), so it is never merged with the deltas after it.
        self._declined: Delta | None = None
        self.offer: Offer | None = None
        # The context of the request's task, where the front makes the mailbox (the edge binds the
        # request's id, user and tier there): outputs arrive in a callback of the engine's reader,
        # in a context of its own, and a failed relay's line is written in this one. Its line named
        # the request by id alone, no user or tier, where every other line the request caused did.
        self._log_context = contextvars.copy_context()
        # Set by the engine process when it hands the request to a child that replaced a dead one
        # less than a minute ago: should that child die holding it, the request may be why
        # (contract.py's ReplicaRestarting.may_be_cause).
        self.may_be_cause = False

    def post(self, output: TokenOutput) -> None:
        """Called from the engine thread."""
        try:
            self.loop.call_soon_threadsafe(self.put, output)
        except RuntimeError:
            # The event loop is closed: nobody is left to read, so stop spending steps on it.
            self._on_orphaned()

    def post_exception(self, error: Exception) -> None:
        """Called from another thread: take() raises `error`."""
        try:
            self.loop.call_soon_threadsafe(self._fail, error)
        except RuntimeError:
            pass

    def put(self, output: TokenOutput) -> None:
        """Called on the loop."""
        if output.error is not None:
            self._fail(UpstreamError(output.error))
            return
        delta = Delta(output.token_ids, output.finish_reason, output.cached_tokens)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            # The consumer waits for this very delta, and only for it (nothing pending, not
            # cancelled): offered first, it is delivered through take only if declined.
            offer = self.offer
            if offer is not None and delta.finish_reason is None:
                try:
                    if offer(delta):
                        return
                    self._declined = delta
                except Exception as exc:
                    # Called in the step that delivers every stream's output: one stream's failed
                    # relay ends that stream with an error, never the others' outputs.
                    self._log_context.run(log.exception, "direct_relay_failed", request_id=output.request_id)
                    self._fail(UpstreamError(f"relaying the output failed: {exc!r}"))
                    return
            # The relay may have cancelled the consumer meanwhile (a write's failure): its waiter
            # is done, and raising here would lose the rest of the step's delivery, other streams'.
            if not waiter.done():
                waiter.set_result(None)
        self._pending.append(delta)

    def fail(self, error: Exception) -> None:
        """Called on the loop: take() raises `error`."""
        self._fail(error)

    def _fail(self, error: Exception) -> None:
        self._error = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> Delta:
        """Everything put since the last take, as one delta (a declined one alone)."""
        if not self._pending and self._error is None:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        deltas = self._pending
        if deltas and deltas[0] is self._declined:
            # Alone, and before a failure posted after it: the edge may have counted, charged or
            # written it in part already (edge/token_relay.py).
            self._declined = None
            self._pending = deltas[1:]
            return deltas[0]
        if self._error is not None:
            raise self._error
        self._pending = []
        if len(deltas) == 1:
            return deltas[0]
        merged = Delta([])
        for delta in deltas:
            merged.token_ids.extend(delta.token_ids)
            merged.finish_reason = delta.finish_reason
            merged.cached_tokens += delta.cached_tokens
        return merged
