"""The Lua scripts and the Python twin, driven through the same random operations at the same
instants, must give identical decisions and end in identical state.

Time is controlled on both sides: the twin reads an injected clock, and the scripts take the same
instant through their test-only `now_override_us` argument instead of Redis TIME. Everything else
(the script text, EVALSHA, the key layout, expiry) is what production runs, so any divergence in
arithmetic, rounding, pruning, tie-breaking or refund logic shows up as a differing answer.
"""

from __future__ import annotations

import random
import uuid

import pytest
from redis.asyncio import Redis

from limiter import policy
from limiter.base import TierLimits
from limiter.memory import MemoryLimiter
from limiter.redis_store import RedisLimiter, user_keys
from tests.limiter.tiers import tier
from tests.support.redis_server import RedisServer

SEEDS = range(10)
OPERATIONS = 500
# Simulated time starts small enough that seconds-as-float round-trip to exact microseconds.
START_US = 10**12

# Steps on the tiers' own grids (intervals of 2 s, 0.1 s, 428 572 µs, 7 ms; a 5 s lease) make
# instants land exactly on boundaries, where `<` versus `<=` and rounding differences show.
STEPS_US = [0, 0, 0, 1, 999, 7_000, 100_000, 428_572, 1_000_000, 2_000_000, 5_000_000, 3_000_001]
TIERS = [
    tier(requests=5, request_window_s=10, tokens=300, token_window_s=30, concurrent=4, name="a"),
    tier(requests=7, request_window_s=3, tokens=1000, token_window_s=7, concurrent=3, name="b"),
    # Whole-second waits on every limit, so ties between the limits' waits occur.
    tier(requests=4, request_window_s=4, tokens=40, token_window_s=4, concurrent=2, name="c"),
    # Concurrency never binds: bursts reach the exact request and token capacity.
    tier(requests=3, request_window_s=3, tokens=100, token_window_s=10, concurrent=100, name="d"),
    # Intervals no whole number of microseconds (333,333.3 and 8,571.43): spans rounded per charge.
    tier(requests=3, request_window_s=1, tokens=700, token_window_s=6, concurrent=3, name="e"),
]
# How often a user is moved to another tier (its key's set-tier): each tier keeps its own budgets,
# the user's streams count against whichever tier it is in now, and each settles where it began.
MOVE = 0.03


@pytest.mark.anyio
@pytest.mark.parametrize("seed", SEEDS)
async def test_redis_scripts_and_the_twin_decide_identically(redis_server: RedisServer, seed: int) -> None:
    rng = random.Random(seed)
    now_us = START_US
    users = [f"diff-{uuid.uuid4().hex}" for _ in TIERS]
    twin = MemoryLimiter(lambda: now_us / policy.MICROS, batch_tokens=16, lease_ttl_s=5)
    store = RedisLimiter.from_url(
        redis_server.url, timeout_ms=5000, batch_tokens=16, lease_ttl_s=5, now_override_us=lambda: now_us
    )
    user = users[0]
    tier_of = {u: TIERS[i % len(TIERS)] for i, u in enumerate(users)}
    # (user, request id, the tier it was admitted in) of admitted requests, settled or not
    live: list[tuple[str, str, TierLimits]] = []
    decisions = denials = 0
    try:
        for step in range(OPERATIONS):
            now_us += rng.choice(STEPS_US)
            # Runs of one user's calls reach the limits' exact edges more often than uniform picks.
            user = user if step and rng.random() < 0.5 else rng.choice(users)
            if rng.random() < MOVE:
                tier_of[user] = rng.choice(TIERS)
            limits = tier_of[user]
            op = rng.random()
            if op < 0.55 or not live:
                request_id = f"r{step}"
                input_tokens = rng.choice([0, 1, 10, rng.randint(0, 120)])
                max_out = rng.choice([0, 5, 16, 40])
                args = (user, request_id, limits, input_tokens, max_out)
                # A max_tokens the client named makes a refusal wait for its whole reply.
                asked = rng.choice([None, max_out])
                expected = (await twin.admit(*args, asked_output_tokens=asked)).decision
                got = (await store.admit(*args, asked_output_tokens=asked)).decision
                assert got == expected, f"seed {seed} step {step}: admit"
                decisions += 1
                denials += not got.allowed
                if got.allowed:
                    live.append((user, request_id, limits))
            elif op < 0.75:
                user, request_id, limits = rng.choice(live)
                want = rng.randint(0, 64)
                expected_grant = await twin.charge(user, limits, request_id, want)
                got_grant = await store.charge(user, limits, request_id, want)
                assert got_grant == expected_grant, f"seed {seed} step {step}: charge"
            else:
                user, request_id, limits = rng.choice(live)
                refund = rng.choice([0, 1, 2, rng.randint(0, 40)])
                ran = rng.random() < 0.8
                await twin.settle(user, limits, request_id, refund, refund_request=not ran)
                await store.settle(user, limits, request_id, refund, refund_request=not ran)

        assert decisions > 100 and 0 < denials < decisions  # the run exercised both answers
        assert len({(u, t.name) for u, _, t in live}) > len(users)  # and users in several tiers
        await _assert_same_state(store, twin, users, now_us)
    finally:
        await store.aclose()


async def _assert_same_state(store: RedisLimiter, twin: MemoryLimiter, users: list[str], now_us: int) -> None:
    client: Redis = store._client  # type: ignore[assignment]
    for user in users:
        entry = twin._users[user]
        for name in (t.name for t in TIERS):
            state = entry.budgets.get(name)
            request_key, token_key, concurrency_key = user_keys(user, name)
            twin_tats = (0, 0) if state is None else (state.request_tat_us, state.token_tat_us)
            for key, tat in zip((request_key, token_key), twin_tats, strict=True):
                stored = await client.get(key)
                # A missing key means "full", as does a twin TAT in the past.
                assert (int(stored) if stored is not None else 0) == tat or (stored is None and tat <= now_us)
        stored_leases = {
            m.decode(): int(s) for m, s in await client.zrange(concurrency_key, 0, -1, withscores=True)
        }
        assert {r: e for r, e in stored_leases.items() if e > now_us} == {
            r: e for r, e in entry.leases.items() if e > now_us
        }


@pytest.mark.anyio
@pytest.mark.parametrize("tokens_per_minute", [7_000_000, 40_000_000, 150_000_000, 1_000_003])
async def test_a_fast_tier_is_enforced_at_its_setting(
    redis_server: RedisServer, tokens_per_minute: int
) -> None:
    """The whole budget spent at once is whole again one window later, on both sides, and not
    sooner. With the interval rounded up to a whole microsecond a token, 40M tokens a minute
    (1.5 µs) was held to 30M: the second minute's budget came 20 s late."""
    now_us = START_US
    limits = tier(tokens=tokens_per_minute, token_window_s=60, max_tokens=0)
    twin = MemoryLimiter(lambda: now_us / policy.MICROS)
    store = RedisLimiter.from_url(redis_server.url, timeout_ms=5000, now_override_us=lambda: now_us)
    user = f"fast-{uuid.uuid4().hex}"
    try:
        for limiter in (twin, store):
            now_us = START_US
            first = (await limiter.admit(user, "r1", limits, tokens_per_minute, 0)).decision
            assert first.allowed and first.remaining_tokens == 0
            assert first.reset_tokens_ms == 60_000
            now_us += 60 * policy.MICROS - 1000
            early = (await limiter.admit(user, "r2", limits, tokens_per_minute, 0)).decision
            assert not early.allowed and early.limit == "tokens" and early.retry_after_ms == 1
            now_us += 1000
            again = (await limiter.admit(user, "r3", limits, tokens_per_minute, 0)).decision
            assert again.allowed, (type(limiter).__name__, again)
    finally:
        await store.aclose()
