"""Outputs of one request, carried from the engine's thread (or process reader) to its event loop.

The consumer drains everything that piled up since it last looked, so a lagging consumer gets
several steps' tokens in one output instead of falling further behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpu_container.engine.types import TokenOutput


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
        self._ready = asyncio.Event()

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
        self._pending.append(output)
        self._ready.set()

    def _fail(self, error: Exception) -> None:
        self._error = error
        self._ready.set()

    async def take(self) -> TokenOutput:
        """Everything posted since the last take, merged into one output."""
        await self._ready.wait()
        self._ready.clear()
        if self._error is not None:
            raise self._error
        outputs, self._pending = self._pending, []
        if len(outputs) == 1:
            return outputs[0]
        merged = TokenOutput(outputs[0].request_id)
        for output in outputs:
            merged.token_ids.extend(output.token_ids)
            merged.finish_reason = output.finish_reason
            merged.error = output.error
            merged.cached_tokens += output.cached_tokens
        return merged
