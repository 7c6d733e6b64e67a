"""The fair queue keeps each waiting user's next price (FairQueue._head_cost) rather than pricing
every waiting user on each ask: a price that follows its user's replies must follow them while it
waits at the head of its user's queue too."""

from __future__ import annotations

import pytest

from tests.admission.conftest import MakeDispatcher
from tests.admission.flow import Flow, ticket
from tests.admission.replicas import ControlledUpstream


@pytest.mark.anyio
async def test_a_waiting_users_next_price_follows_the_reply_that_ended_meanwhile(
    make_dispatcher: MakeDispatcher,
) -> None:
    """One place. A free user's first request runs while its next waits at the head of its queue,
    priced at the prior reply length (1,000 tokens); a paid request waits too. The first reply ends
    at 10 tokens: the user's replies are 10 tokens long now, and the paid request takes the place,
    so nothing free runs and the free tier's lead is counted in its waiting users' next prices.
    The free user's was kept at 1,000 + 10 while its fair price was 10 + 10: a returning user's
    lead (and the Retry-After told) counted in ends 50 times dearer than they are."""
    replica = ControlledUpstream("r1", max_sequences=1, kv_tokens_total=100_000)
    async with make_dispatcher([replica], prior_reply_tokens=1000) as dispatcher:
        flow = Flow(dispatcher)
        first = flow.submit(ticket("a", kv_tokens=1010, prompt_tokens=10))
        await flow.settle()
        flow.submit(ticket("a", kv_tokens=1010, prompt_tokens=10))
        flow.submit(ticket("b", kv_tokens=1010, prompt_tokens=10))
        paid = flow.submit(ticket("p", paid=True))
        await flow.settle()

        first.result().grow(10)
        await flow.release_oldest()
        assert paid.done()  # the place is the paid tier's: nothing of the free tier runs

        free = dispatcher._queue._tier(0)
        priced = [dispatcher._fair_cost(queue[0].ticket) for queue in free._queues.values()]
        assert free._cost_per_end(ticket("c")) == sum(priced) / len(priced) == (20 + 1010) / 2
        await flow.aclose()
