"""A call its slot answers TRYAGAIN stays within the limiter's bound on a call, its first send
included (limiter/direct_calls.py DirectCalls.call). The sends are fakes that count themselves: how
many a call makes, not how long it takes, is what is asserted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from limiter.direct_calls import DirectCalls, SlotBusy, _TryAgain

pytestmark = pytest.mark.anyio
BOUND_S = 0.05


def _calls(send: Callable[[int], Awaitable[Any]]) -> tuple[DirectCalls, list[int]]:
    """DirectCalls whose every send is `send(n)` (n: which send of the call, from 1)."""
    direct = DirectCalls(Redis(), connect_timeout_s=BOUND_S, single=None, bound_s=BOUND_S)
    sent: list[int] = []

    async def call_once(*_: Any) -> Any:
        sent.append(len(sent) + 1)
        return await send(len(sent))

    direct._call_once = call_once  # type: ignore[method-assign,assignment]
    return direct, sent


async def test_a_first_send_that_took_the_bound_is_not_sent_again() -> None:
    """The first send took the whole bound (a connect, a slot map reload) and met TRYAGAIN: the
    call is SlotBusy at once. The wait was timed from the first TRYAGAIN, so the call kept sending
    again for another min(TRYAGAIN_WAIT_S, bound), past the bound."""

    async def send(n: int) -> Any:
        if n == 1:
            await asyncio.sleep(BOUND_S)  # a slow first round trip, not a synchronisation
        raise _TryAgain("TRYAGAIN Multiple keys request during rehashing of slot")

    direct, sent = _calls(send)
    with pytest.raises(SlotBusy):
        await direct.call(None, ["k"], [])  # type: ignore[arg-type]
    assert sent == [1]


async def test_a_send_again_that_gets_no_reply_ends_at_the_bound() -> None:
    """A send again whose reply never comes ends the call at the call's bound (TimeoutError, as
    any call past its bound), rather than waiting on that send's own deadline, a whole bound more."""
    never = asyncio.Event()

    async def send(n: int) -> Any:
        if n == 1:
            raise _TryAgain("TRYAGAIN Multiple keys request during rehashing of slot")
        await never.wait()  # no reply, and a fake has no connection deadline

    direct, sent = _calls(send)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(30) as guard:  # only so that a regression fails, not hangs
            await direct.call(None, ["k"], [])  # type: ignore[arg-type]
    assert not guard.expired()
    assert sent == [1, 2]
