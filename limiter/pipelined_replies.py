"""Replies of a pipeline of one script's calls, sent again once after NOSCRIPT: the one rule both
ways of sending a batch follow (the limiter's own connection, limiter/direct_calls.py; a pooled
redis-py connection, RedisLimiter._pipelined)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import NoScriptError


async def replies_loading_once(
    send: Callable[[], Awaitable[list[Any]]], load: Callable[[], Awaitable[Any]], sha: str
) -> list[Any]:
    """`send()` writes the batch and returns its replies, error replies as exception values. If
    every error is NOSCRIPT (a restarted Redis), `load()` the script and send them all again;
    any other error reply is raised."""
    for _ in range(2):  # a second time only after loading the script (NOSCRIPT)
        replies = await send()
        errors = [r for r in replies if isinstance(r, Exception)]
        if not errors:
            return replies
        if not all(isinstance(e, NoScriptError) for e in errors):
            raise errors[0]
        # Every call failed the same way before running (or, for the idempotent admit, settle and
        # restore, running one twice is harmless): sending them all again is safe.
        await load()
    raise NoScriptError(f"script {sha} missing right after loading it")
