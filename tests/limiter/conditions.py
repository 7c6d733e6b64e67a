"""Waiting on a condition of real state (Redis contents, limiter counters) with bounded polling:
how the tests synchronise with background work, never with a sleep of a guessed length."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

WAIT_S = 20.0  # never reached when the code under test is right; it only keeps a bug from hanging
_POLL_S = 0.001


async def wait_until(what: str, predicate: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if await predicate():
            return
        if loop.time() > deadline:
            pytest.fail(f"never reached within {timeout_s:g} s: {what}")
        await asyncio.sleep(_POLL_S)
