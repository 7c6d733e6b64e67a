"""The part of the edge's request pipeline that talks to the dispatcher, as the tests need it."""

from __future__ import annotations

from edge.admission import Dispatcher, Slot, Ticket
from edge.upstreams.base import GenerationRequest, UpstreamError


async def generate_with_failover(
    dispatcher: Dispatcher, ticket: Ticket, prompt_ids: list[int], max_new_tokens: int
) -> tuple[Slot, list[int]]:
    """acquire → generate → release; a failure before the first token retries on another replica."""
    exclude: frozenset[str] = frozenset()
    while True:
        slot = await dispatcher.acquire(ticket, exclude)
        tokens: list[int] = []
        request = GenerationRequest(ticket.request_id, prompt_ids, max_new_tokens, temperature=0.0)
        try:
            async for delta in slot.upstream.generate(request):
                tokens += delta.token_ids
        except UpstreamError:
            if tokens:
                slot.release()
                raise
            slot.release(failed=True)
            exclude |= {slot.upstream.name}
            continue
        slot.release()
        return slot, tokens
