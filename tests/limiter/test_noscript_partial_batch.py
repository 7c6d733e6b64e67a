"""A batch of one script's calls whose script cache is flushed part-way (another client's SCRIPT
FLUSH between two of its EVALSHAs, on a real Redis) answers the first calls and NOSCRIPT for the
rest. Only the rest are sent again once the script is loaded: the whole batch was before, and a
charge that had run ran twice (two extensions of 10 tokens cost 30; a review). Charges take this
path on redis-py's connections (a Unix socket, a credential provider)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from limiter import policy
from limiter.pipelined_replies import replies_loading_once
from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer

NOW_US = 10**12


async def _charges_of(redis_server: RedisServer, flush_after: int | None) -> tuple[list[Any], int, int]:
    """Three charges of 10 tokens of one request in one batch, SCRIPT FLUSH after `flush_after`
    of them on the first send (None: before the batch, as a restarted Redis). Returns the replies,
    how many calls were sent in all, and the tokens the user was charged."""
    limiter = RedisLimiter.from_url(redis_server.url, timeout_ms=2000, now_override_us=lambda: NOW_US)
    raw = Redis.from_url(redis_server.url)
    user, limits = f"ns-{uuid.uuid4().hex}", tier(tokens=1000, token_window_s=1000)
    script = limiter._charge
    _, tokens_key, concurrency_key = user_keys(user, limits.name)
    rates = policy.rates_for(limits)
    call = ((tokens_key, concurrency_key), (str(NOW_US), "r1", rates.token_window_us, 1000, 10, 5_000_000))
    sent = 0
    first = True
    try:
        assert (await limiter.admit(user, "r1", limits, 0, 0)).decision.allowed
        await raw.script_load(script.script)

        async def send(batch: Sequence[Any]) -> list[Any]:
            nonlocal sent, first
            pipe = raw.pipeline(transaction=False)
            if first and flush_after is None:
                pipe.script_flush()
            for i, (keys, args) in enumerate(batch):
                if first and i == flush_after:
                    pipe.script_flush()
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            flushed = first and (flush_after is None or flush_after < len(batch))
            first = False
            sent += len(batch)
            replies = await pipe.execute(raise_on_error=False)
            return [r for r in replies if r is not True] if flushed else replies

        replies = await replies_loading_once(
            send, lambda: raw.script_load(script.script), script.sha, [call] * 3
        )
        # 1 s a token (1000 per 1000 s): the token TAT's lead in seconds is the tokens charged.
        charged = (int(await raw.get(tokens_key)) - NOW_US) // policy.MICROS
        return replies, sent, charged
    finally:
        await raw.aclose()
        await limiter.aclose()


@pytest.mark.anyio
async def test_the_calls_that_ran_before_a_flush_mid_batch_are_not_sent_again(
    redis_server: RedisServer,
) -> None:
    replies, sent, charged = await _charges_of(redis_server, flush_after=1)
    assert replies == [10, 10, 10]
    assert sent == 3 + 2  # the two that met NOSCRIPT, again
    assert charged == 30


@pytest.mark.anyio
async def test_a_batch_that_met_noscript_whole_is_sent_again_whole(redis_server: RedisServer) -> None:
    replies, sent, charged = await _charges_of(redis_server, flush_after=None)
    assert replies == [10, 10, 10]
    assert sent == 3 + 3
    assert charged == 30
