"""asyncio face of LLMEngine: one async iterator of TokenOutput per request.

The engine thread's callback hands each output to the event loop with call_soon_threadsafe; the
consumer drains everything that piled up since it last looked, so a lagging consumer gets several
steps' tokens in one TokenOutput instead of falling further behind. Leaving the iterator early
(break, aclose, task cancellation) aborts the request, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from collections.abc import Sequence as Seq

from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineStats, SamplingParams, TokenOutput


class Mailbox:
    """Outputs of one request, gathered on its event loop until the consumer takes them.

    Filled from the engine thread (post) or, by the engine process's reader, already on the loop
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
        merged = TokenOutput(outputs[0].request_id)
        for output in outputs:
            merged.token_ids.extend(output.token_ids)
            merged.finish_reason = output.finish_reason
            merged.error = output.error
        return merged


async def mailbox_stream(
    mailbox: Mailbox, start: Callable[[], None], abort: Callable[[], None]
) -> AsyncGenerator[TokenOutput, None]:
    """One request's outputs until its final one: the abort-on-close rule, written once.

    `start` submits the request at the first iteration, so a refusal is raised there; leaving
    early (break, aclose, task cancellation) calls `abort`, which frees the sequence's blocks.
    """
    start()
    finished = False
    try:
        while not finished:
            output = await mailbox.take()
            finished = output.finish_reason is not None
            yield output
    finally:
        if not finished:
            abort()


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def generate(
        self, request_id: str, prompt_ids: Seq[int], params: SamplingParams, priority: int = 0
    ) -> AsyncGenerator[TokenOutput, None]:
        """Call from the event loop that will read the stream."""
        mailbox = Mailbox(asyncio.get_running_loop(), lambda: self.engine.abort(request_id))
        return mailbox_stream(
            mailbox,
            lambda: self.engine.add_request(request_id, prompt_ids, params, mailbox.post, priority),
            lambda: self.engine.abort(request_id),
        )

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def running(self) -> bool:
        return self.engine.running

    def stop(self) -> None:
        self.engine.stop()
