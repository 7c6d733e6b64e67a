"""Stopping a background task for good: cancel it, and cancel it again until it has ended. Every
long-lived task the edge starts (writers, pollers, listeners, the fleet beat) stops through here.

A cancel is one CancelledError thrown into the task. A library that turns it into another error (a
Redis client's socket timeout around a cancelled read) and a loop that catches that error and goes
on leave the task running, marked "cancelling", and whoever awaits it waits forever. Seen in the
tests: an edge hung at shutdown in 4 of about 56 runs of tests/models under load, its lifespan
awaiting the fleet-membership task, which had been cancelled inside a Redis call and was asleep
before its next beat."""

from __future__ import annotations

import asyncio
from typing import Any

# How long a cancelled task has to end before it is cancelled again.
RECANCEL_S = 0.5


async def stop_task(task: asyncio.Task[Any], recancel_s: float = RECANCEL_S) -> None:
    """Cancel `task` until it ends; re-raise what it raised if that was not its cancellation."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=recancel_s)
    if not task.cancelled():
        task.result()


def cancelling() -> bool:
    """Whether the running task has been asked to stop: a loop that catches a library's errors
    checks it, so that a cancellation the library turned into one of them still ends it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
