"""Outputs of one request, carried from the engine's thread (or process reader) to its event loop.

The consumer drains everything that piled up since it last looked, so a lagging consumer gets
several steps' tokens in one output instead of falling further behind.

While the consumer waits in `take` with nothing pending, an output may be offered to `offer`
instead (the edge's direct relay, edge/upstreams/direct.py): the engine process hands a whole
step's outputs to the loop in one callback, and a token the edge relays right there wakes no task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from gpu_container.contract import UpstreamError
from gpu_container.engine.types import TokenOutput

log = structlog.get_logger(__name__)

# Takes an output while the consumer waits (True: relayed, not to be delivered again).
Offer = Callable[[TokenOutput], bool]


class Mailbox:
    """Filled from the engine thread (post) or, by the engine process's reader, already on the loop
    (put). An exception posted instead (a request the engine process refused) is raised by take.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_orphaned: Callable[[], None] = lambda: None
    ) -> None:
        self.loop = loop
        self._on_orphaned = on_orphaned
        self._pending: list[TokenOutput] = []
        self._error: Exception | None = None
        # What `take` waits on while nothing is pending (done once something is, or when cancelled).
        self._waiter: asyncio.Future[None] | None = None
        # The output `offer` declined, which `take` hands over alone: the edge may have relayed part
        # of it already (a write left to await, a stop string found) and knows it by identity, so it
        # must come as it was offered, not merged with the outputs after it.
        self._declined: TokenOutput | None = None
        self.offer: Offer | None = None

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
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            # The consumer waits for this very output, and only for it (nothing pending, not
            # cancelled): offered first, it is delivered through take only if declined.
            offer = self.offer
            if offer is not None and output.finish_reason is None and output.error is None:
                try:
                    if offer(output):
                        return
                    self._declined = output
                except Exception as exc:
                    # Called in the step that delivers every stream's output: one stream's failed
                    # relay ends that stream with an error, never the others' outputs.
                    log.exception("direct_relay_failed", request_id=output.request_id)
                    self._fail(UpstreamError(f"relaying the output failed: {exc!r}"))
                    return
            waiter.set_result(None)
        self._pending.append(output)

    def _fail(self, error: Exception) -> None:
        self._error = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> TokenOutput:
        """Everything posted since the last take, merged into one output."""
        if not self._pending and self._error is None:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        outputs, self._pending = self._pending, []
        if len(outputs) == 1 or outputs[0] is self._declined:
            self._declined = None
            self._pending = outputs[1:]
            return outputs[0]
        merged = TokenOutput(outputs[0].request_id)
        for output in outputs:
            merged.token_ids.extend(output.token_ids)
            merged.finish_reason = output.finish_reason
            merged.error = output.error
            merged.cached_tokens += output.cached_tokens
        return merged
