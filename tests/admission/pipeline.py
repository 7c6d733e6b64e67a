"""The part of the edge's request pipeline that talks to the dispatcher, as the tests need it."""

from __future__ import annotations

from collections.abc import Callable

from edge.admission import Dispatcher, Slot, Ticket
from edge.upstreams.base import GenerationRequest, UpstreamError


def _nothing() -> None:
    return None


async def generate_with_failover(
    dispatcher: Dispatcher,
    ticket: Ticket,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    before_release: Callable[[], None] = _nothing,
) -> tuple[Slot, list[int]]:
    """acquire → generate → release; a failure before the first token retries on another replica.
    `before_release` runs once the generation is complete, just before its room is given back (and
    possibly granted to a waiting ticket in the same call)."""
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
        before_release()
        slot.release()
        return slot, tokens
