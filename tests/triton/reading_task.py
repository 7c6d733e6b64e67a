"""A stream's reading task cancelled once the first token arrived: how a client that goes away
looks to an upstream (the ASGI task is cancelled, the generator closed from inside it)."""

from __future__ import annotations

import anyio

from edge.upstreams.base import GenerationRequest, Upstream

PROMPT = [11, 42, 7, 300, 5, 91, 18, 260]


async def cancel_after_first_token(upstream: Upstream, request_id: str, timeout_s: float) -> None:
    """Start a 1,500-token greedy request and cancel the task reading it at its first token."""
    first_token = anyio.Event()

    async def consume() -> None:
        request = GenerationRequest(request_id, PROMPT, max_new_tokens=1500, temperature=0.0)
        async for _ in upstream.generate(request):
            first_token.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        with anyio.fail_after(timeout_s):
            await first_token.wait()
        tg.cancel_scope.cancel()
