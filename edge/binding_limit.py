"""Which refusal names what fits, for a max_tokens past the model's context: the context's, or every
replica's KV cache's where that is the smaller limit.

The context's refusal came first, and a client (the playground, a script) lowered max_tokens to the
context's room as it said, only to be refused again past the replicas' KV cache (a replica smaller
than the context, or the tier's part of it less the paid reserve): the number it had been given was
one that never fits. Where the context's room would never fit the cache either, the cache's refusal
is the one whose limit, less the messages, fits both."""

from __future__ import annotations

from edge.admission.dispatcher import Dispatcher
from edge.admission.ticket import NeverFits, Ticket
from edge.config import TierConfig
from edge.errors import ApiError, never_fits_error


def cache_refusal_past_the_context(
    dispatcher: Dispatcher, tier: TierConfig, prompt_tokens: int, room: int, asked: int
) -> ApiError | None:
    """The KV cache's refusal of `asked` completion tokens, where even the context's `room` never
    fits any replica; None where the room does (the context's refusal names what fits)."""

    def probe(max_new: int) -> Ticket:
        # What check_fits reads: the tier's kind and the request's sizes.
        return Ticket(
            request_id="",
            user="",
            priority=tier.priority,
            kv_tokens=prompt_tokens + max_new,
            max_wait_s=0.0,
            may_use_reserve=tier.may_use_reserve,
            prompt_tokens=prompt_tokens,
        )

    try:
        dispatcher.check_fits(probe(room))
        return None
    except NeverFits:
        pass
    try:
        # Larger than the room, so past every cache too: the refusal gives the sizes asked for.
        dispatcher.check_fits(probe(asked))
    except NeverFits as exc:
        return never_fits_error(exc)
    return None
