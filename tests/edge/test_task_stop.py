"""Stopping background tasks whose cancellation a library turned into an error of its own."""

from __future__ import annotations

import asyncio

import pytest

from edge.task_stop import cancelling, stop_task

pytestmark = pytest.mark.anyio


async def _library_call() -> None:
    """A call that, cancelled, raises its own timeout instead (as a client's socket timeout can)."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        raise TimeoutError("read timed out") from None


async def _beats(guarded: bool, calls: list[int]) -> None:
    """A background loop that treats a timed-out call as a reason to retry later."""
    while True:
        try:
            calls.append(1)
            await _library_call()
        except TimeoutError:
            if guarded and cancelling():
                raise asyncio.CancelledError from None
        await asyncio.sleep(60)


async def test_one_cancel_is_lost_in_the_library_and_stop_task_asks_again() -> None:
    calls: list[int] = []
    task = asyncio.create_task(_beats(guarded=False, calls=calls))
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.2)
    assert not done  # what awaiting it after one cancel did: wait forever
    assert task.cancelling() == 1
    await asyncio.wait_for(stop_task(task, recancel_s=0.01), timeout=5)
    assert task.cancelled()


async def test_a_loop_that_checks_cancelling_ends_on_the_first_cancel() -> None:
    calls: list[int] = []
    task = asyncio.create_task(_beats(guarded=True, calls=calls))
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done == {task}
    assert task.cancelled()
    assert len(calls) == 1


async def test_stop_task_raises_what_the_task_raised() -> None:
    async def broken() -> None:
        raise ValueError("boom")

    task = asyncio.create_task(broken())
    await asyncio.wait({task})
    with pytest.raises(ValueError, match="boom"):
        await stop_task(task)
