"""Drives many acquire() calls at once and records what they were granted, in grant order."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import anyio
import anyio.lowlevel

from edge.admission import Dispatcher, Slot, Ticket


def counting_clock() -> Callable[[], float]:
    """A clock that ticks once per reading: grant order is readable from Slot.granted_at."""
    counter = itertools.count()
    return lambda: float(next(counter))


async def until(predicate: Callable[[], bool], timeout_s: float = 30.0, poll_s: float = 0.0) -> None:
    """Yield to the event loop until predicate holds (the tasks it watches make progress meanwhile).
    Bounded well past what it takes: 5 s ran out once in a full-suite run beside other work.

    poll_s > 0 waits that long between looks: where engine threads do the work, a loop that only
    yields to the event loop keeps the GIL busy, and each of the engine's numpy calls that gives it
    up waits a switch interval (5 ms) to get it back (on a machine whose GEMV/GEMM knee is 11 rows,
    a demo-model step of 4 rows made 32 such calls: 57 requests took 47 s instead of one)."""
    with anyio.fail_after(timeout_s):
        while not predicate():
            if poll_s:
                await anyio.sleep(poll_s)
            else:
                await anyio.lowlevel.checkpoint()


_serial = itertools.count()


def ticket(
    user: str,
    *,
    paid: bool = False,
    kv_tokens: int = 100,
    max_wait_s: float = 60.0,
    tier: str | None = None,
    prompt_tokens: int | None = None,
) -> Ticket:
    return Ticket(
        request_id=f"req-{next(_serial)}",
        user=user,
        priority=10 if paid else 0,
        kv_tokens=kv_tokens,
        max_wait_s=max_wait_s,
        may_use_reserve=paid,
        tier=tier or ("paid" if paid else "free"),
        prompt_tokens=prompt_tokens,
    )


class Flow:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.tasks: list[asyncio.Task[Slot]] = []

    def submit(self, t: Ticket) -> asyncio.Task[Slot]:
        task = asyncio.create_task(self.dispatcher.acquire(t))
        self.tasks.append(task)
        return task

    async def settle(self) -> None:
        """Wait until every submitted request is either queued or answered."""

        def answered_or_queued() -> bool:
            done = sum(t.done() for t in self.tasks)
            return self.dispatcher.queue_depth() + done == len(self.tasks)

        await until(answered_or_queued)

    def granted(self) -> list[Slot]:
        """Granted slots, in grant order."""
        slots = [t.result() for t in self.tasks if t.done() and not t.cancelled() and t.exception() is None]
        return sorted(slots, key=lambda s: s.granted_at)

    def held(self) -> list[Slot]:
        return [s for s in self.granted() if not s.released]

    async def release_oldest(self) -> None:
        """The oldest slot's reply ran to its end (its length what it `grow`s to), as the
        pipeline's do when their relay returns (edge/generation.py)."""
        oldest = self.held()[0]
        oldest.mark_finished()
        oldest.release()
        await self.settle()

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
