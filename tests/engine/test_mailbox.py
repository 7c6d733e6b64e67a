"""gpu_container/engine/mailbox.py: an output the consumer waits for is offered to the edge's
direct relay first, as a delta (no wake-up when taken); anything else is delivered through take, in
order; an output carrying an error fails the stream."""

from __future__ import annotations

import asyncio

import pytest

from gpu_container.contract import Delta, UpstreamError
from gpu_container.engine.mailbox import Mailbox
from gpu_container.engine.types import TokenOutput

pytestmark = pytest.mark.anyio


async def _parked(mailbox: Mailbox) -> asyncio.Task[Delta]:
    task = asyncio.ensure_future(mailbox.take())
    await asyncio.sleep(0)  # one loop pass: the task is now waiting inside take
    assert mailbox._waiter is not None and not mailbox._waiter.done()
    return task


async def test_an_output_the_consumer_waits_for_is_offered_and_not_delivered_again() -> None:
    mailbox = Mailbox(asyncio.get_running_loop())
    offered: list[list[int]] = []
    mailbox.offer = lambda out: offered.append(out.token_ids) or True
    task = await _parked(mailbox)
    mailbox.put(TokenOutput("r", [1]))
    mailbox.put(TokenOutput("r", [2]))
    assert offered == [[1], [2]]
    assert not task.done()
    mailbox.put(TokenOutput("r", [3], "length"))  # the last output always goes through take
    assert (await task).token_ids == [3]
    assert offered == [[1], [2]]


async def test_a_declined_output_is_taken_alone_and_later_ones_after_it_in_order() -> None:
    """The relay may have written part of what it declined and knows it by identity: it comes as
    it was offered, never merged with what came after it (edge/token_relay.py)."""
    mailbox = Mailbox(asyncio.get_running_loop())
    offered: list[Delta] = []
    mailbox.offer = lambda out: offered.append(out) or False
    task = await _parked(mailbox)
    mailbox.put(TokenOutput("r", [1]))
    mailbox.put(TokenOutput("r", [2]))  # the consumer is not waiting any more: not offered
    mailbox.put(TokenOutput("r", [3]))
    assert [o.token_ids for o in offered] == [[1]]
    assert await task is offered[0]
    assert (await mailbox.take()).token_ids == [2, 3]


async def test_a_cancelled_consumer_is_offered_nothing() -> None:
    mailbox = Mailbox(asyncio.get_running_loop())
    offered: list[list[int]] = []
    mailbox.offer = lambda out: offered.append(out.token_ids) or True
    task = await _parked(mailbox)
    task.cancel()  # not run yet: the put below comes between the cancel and the task's wake-up
    mailbox.put(TokenOutput("r", [1]))
    await asyncio.wait({task})
    assert task.cancelled()
    assert offered == []


async def test_a_consumer_cancelled_inside_its_offer_leaves_the_delivery_whole() -> None:
    """A cancel that lands inside the offer (a write whose failure cancels the stream's task, as
    tests/edge/test_token_relay.py's cancel between two streams' offers) of a delta the relay then
    declines: its waiter is already cancelled. `put` raised InvalidStateError there, out of the
    engine process's delivery of a whole step (engine_process.py `_deliver`), whose later outputs,
    other streams', were lost. Found by a review."""
    mailbox = Mailbox(asyncio.get_running_loop())
    task = await _parked(mailbox)

    def offer(delta: Delta) -> bool:
        task.cancel()
        return False  # declined: the task would take it

    mailbox.offer = offer
    mailbox.put(TokenOutput("r", [1]))
    await asyncio.wait({task})
    assert task.cancelled()


async def test_a_relay_that_raises_ends_its_own_stream_with_an_error_and_no_other() -> None:
    loop = asyncio.get_running_loop()
    broken, healthy = Mailbox(loop), Mailbox(loop)

    def fail(out: Delta) -> bool:
        raise RuntimeError("the relay broke")

    broken.offer = fail
    healthy.offer = lambda out: False
    tasks = [await _parked(broken), await _parked(healthy)]
    for mailbox in (broken, healthy):  # one engine step delivering to both, in one callback
        mailbox.put(TokenOutput("r", [1]))
    with pytest.raises(UpstreamError, match="the relay broke"):
        await tasks[0]
    assert (await tasks[1]).token_ids == [1]


async def test_a_declined_output_is_taken_before_a_failure_posted_after_it() -> None:
    """The relay may have counted, charged or written part of what it declined: raised first, the
    failure dropped it (tokens in usage and charged that the client never got)."""
    mailbox = Mailbox(asyncio.get_running_loop())
    offered: list[Delta] = []
    mailbox.offer = lambda out: offered.append(out) or False
    task = await _parked(mailbox)
    mailbox.put(TokenOutput("r", [1]))
    mailbox.fail(UpstreamError("the engine died"))
    assert await task is offered[0]
    with pytest.raises(UpstreamError, match="the engine died"):
        await mailbox.take()


async def test_an_output_carrying_an_error_fails_the_stream_with_what_it_had_pending() -> None:
    """As a merged output carrying the error did: the tokens not yet taken go with the stream."""
    mailbox = Mailbox(asyncio.get_running_loop())
    mailbox.put(TokenOutput("r", [1]))
    mailbox.put(TokenOutput("r", [], "error", "the step failed"))
    with pytest.raises(UpstreamError, match="the step failed"):
        await mailbox.take()


async def test_a_lagging_consumer_gets_what_piled_up_as_one_delta() -> None:
    mailbox = Mailbox(asyncio.get_running_loop())
    mailbox.put(TokenOutput("r", [1], cached_tokens=32))
    mailbox.put(TokenOutput("r", [2]))
    mailbox.put(TokenOutput("r", [3], "stop"))
    assert await mailbox.take() == Delta([1, 2, 3], "stop", 32)
