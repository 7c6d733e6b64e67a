"""Replies of a pipeline of one script's calls, those that met NOSCRIPT sent again once: the one
rule both ways of sending a batch follow (the limiter's own connection, limiter/direct_calls.py; a
pooled redis-py connection, RedisLimiter._send_all)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError

Call = TypeVar("Call")


async def replies_loading_once(
    send: Callable[[Sequence[Call]], Awaitable[list[Any]]],
    load: Callable[[], Awaitable[Any]],
    sha: str,
    calls: Sequence[Call],
) -> list[Any]:
    """`send(calls)` writes those calls in one batch and returns their replies, error replies as
    exception values. If every error is NOSCRIPT (a restarted Redis, a SCRIPT FLUSH), `load()` the
    script and send again the calls that met it, and only those: a flush can land between two calls
    of one batch, and the calls before it ran (a charge sent twice charged twice, a review). Any
    other error reply is raised."""
    replies = await send(calls)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, Exception)]
    if not missing:
        return replies
    if not all(isinstance(replies[i], NoScriptError) for i in missing):
        raise next(replies[i] for i in missing if not isinstance(replies[i], NoScriptError))
    await load()
    again = await send([calls[i] for i in missing])
    for i, reply in zip(missing, again, strict=True):
        if isinstance(reply, NoScriptError):
            raise NoScriptError(f"script {sha} missing right after loading it")
        if isinstance(reply, Exception):
            raise reply
        replies[i] = reply
    return replies
