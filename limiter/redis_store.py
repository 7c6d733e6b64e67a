"""The shared limiter: one atomic Lua step per decision on Redis (standalone or Cluster).

Scripts are called by SHA and loaded again when Redis answers NOSCRIPT (redis-py's registered
scripts do both), so a restarted or failed-over Redis needs nothing from us. Every call is bounded
by a timeout; when Redis fails the tier's `on_store_failure` applies: "open" answers from a local
twin whose limits are divided by the number of edge instances, "closed" raises StoreUnavailable.
After a failure the store is left alone for a short backoff (so a dead Redis does not cost every
request a timeout), then the next call tries it again: recovery needs no restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import structlog
from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript

from limiter import policy
from limiter.base import Admission, Decision, LimitName, StoreUnavailable, TierLimits
from limiter.lease import admission
from limiter.memory import DEFAULT_BATCH_TOKENS, DEFAULT_LEASE_TTL_S, MemoryLimiter
from limiter.metrics import FALLBACK_ACTIVE, STORE_FAILURES
from limiter.scripts import script_text

log = structlog.get_logger("limiter")

DEFAULT_BACKOFF_S = 1.0
# In-flight script calls per limiter. redis-py's pools raise instead of waiting when exhausted, so
# the limiter queues callers itself; one call takes well under a millisecond on Redis.
DEFAULT_MAX_CONNECTIONS = 64
_LIMIT_NAMES: dict[int, LimitName] = {1: "requests", 2: "tokens", 3: "concurrency"}
Op = Literal["admit", "charge", "settle"]


class _StoreDown(Exception):
    """Redis failed (or is inside its backoff after a failure) for this call."""


def user_keys(user: str) -> tuple[str, str, str]:
    """The user's three keys; the {user} hash tag puts them in one Cluster slot."""
    return f"fg:{{{user}}}:req", f"fg:{{{user}}}:tok", f"fg:{{{user}}}:conc"


class RedisLimiter:
    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        timeout_ms: int,
        instance_count: int = 1,
        batch_tokens: int = DEFAULT_BATCH_TOKENS,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        now_override_us: Callable[[], int] | None = None,
    ) -> None:
        """`now_override_us` is for tests only: the scripts then take this time instead of Redis
        TIME, so a test can drive Redis and the twin through the same instants."""
        self._client = client
        self._timeout_s = timeout_ms / 1000
        self.batch_tokens = batch_tokens
        self._lease_ttl_us = round(lease_ttl_s * policy.MICROS)
        self._backoff_s = backoff_s
        self._now_override_us = now_override_us
        self._in_flight = asyncio.Semaphore(max_connections)
        self._admit = client.register_script(script_text("admit"))
        self._charge = client.register_script(script_text("charge"))
        self._settle = client.register_script(script_text("settle"))
        self._fallback = MemoryLimiter(
            batch_tokens=batch_tokens, lease_ttl_s=lease_ttl_s, instance_count=instance_count
        )
        self._rates: dict[TierLimits, policy.Rates] = {}
        self._down_until = 0.0
        self._failing = False
        self._cluster_ready = not isinstance(client, RedisCluster)

    @classmethod
    def from_url(
        cls, url: str, *, timeout_ms: int, instance_count: int = 1, cluster: bool = False, **kwargs: Any
    ) -> RedisLimiter:
        """`redis://…` for one server, `redis+cluster://…` (or cluster=True) for a Cluster."""
        if url.startswith("redis+cluster://"):
            url, cluster = "redis://" + url.removeprefix("redis+cluster://"), True
        timeout_s = timeout_ms / 1000
        client: Redis | RedisCluster
        if cluster:
            client = RedisCluster.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        else:
            client = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        return cls(client, timeout_ms=timeout_ms, instance_count=instance_count, **kwargs)

    @property
    def fallback_active(self) -> bool:
        return self._failing

    def _rates_for(self, tier: TierLimits) -> policy.Rates:
        rates = self._rates.get(tier)
        if rates is None:
            rates = self._rates[tier] = policy.rates_for(tier)
        return rates

    def _now_arg(self) -> str:
        return "" if self._now_override_us is None else str(self._now_override_us())

    async def _run(self, op: Op, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        if self._failing and time.monotonic() < self._down_until:
            raise _StoreDown
        try:
            if not self._cluster_ready:
                # Fetch the slot map before the first burst of calls: redis-py's cluster client
                # fails with AttributeError when many first calls race to set it up. This one-time
                # set-up (slot map and command table: ~50 ms, 100-150 ms on a busy 2-core host) is
                # no store call, so it stays out of the per-call bound (else the first decisions
                # after start fall back); the client's connect and read timeouts bound it.
                await self._client.initialize()
                self._cluster_ready = True
            # Waiting for a free connection counts against the bound: it is the decision's latency.
            async with asyncio.timeout(self._timeout_s), self._in_flight:
                result = await script(keys=keys, args=args)
        # Any failure of the store or its driver (redis-py's cluster client has raised
        # AttributeError in races) is a store failure: the tier's policy answers, nothing escapes.
        except Exception as exc:
            STORE_FAILURES.labels(op=op).inc()
            self._down_until = time.monotonic() + self._backoff_s
            if not self._failing:
                self._failing = True
                FALLBACK_ACTIVE.set(1)
            log.warning("limiter_store_failed", op=op, error=type(exc).__name__, backoff_s=self._backoff_s)
            raise _StoreDown from exc
        if self._failing:
            self._failing = False
            FALLBACK_ACTIVE.set(0)
            log.info("limiter_store_recovered", op=op)
        return result

    async def admit(
        self, user: str, request_id: str, tier: TierLimits, input_tokens: int, max_output_tokens: int
    ) -> Admission:
        rates = self._rates_for(tier)
        lease_tokens = policy.initial_lease(rates, self.batch_tokens, input_tokens, max_output_tokens)
        args = (
            self._now_arg(),
            request_id,
            rates.request_interval_us,
            rates.request_capacity,
            rates.token_interval_us,
            rates.token_capacity,
            rates.max_concurrent,
            input_tokens,
            lease_tokens,
            self._lease_ttl_us,
        )
        try:
            reply = await self._run("admit", self._admit, user_keys(user), args)
        except _StoreDown:
            if tier.on_store_failure == "closed":
                raise StoreUnavailable(max(self._down_until - time.monotonic(), 0.001)) from None
            return await self._fallback.admit(user, request_id, tier, input_tokens, max_output_tokens)
        allowed, limit, retry_ms, rem_req, reset_req, rem_tok, reset_tok = (int(v) for v in reply)
        decision = Decision(
            allowed=bool(allowed),
            limit=_LIMIT_NAMES.get(limit),
            retry_after_ms=retry_ms,
            limit_requests=rates.request_capacity,
            remaining_requests=rem_req,
            reset_requests_ms=reset_req,
            limit_tokens=rates.token_capacity,
            remaining_tokens=rem_tok,
            reset_tokens_ms=reset_tok,
        )
        return admission(
            self,
            decision,
            user,
            tier,
            request_id,
            input_tokens=input_tokens,
            granted=lease_tokens,
            max_output_tokens=max_output_tokens,
            batch_tokens=self.batch_tokens,
        )

    async def charge(self, user: str, tier: TierLimits, request_id: str, want: int) -> int:
        rates = self._rates_for(tier)
        _, tokens_key, concurrency_key = user_keys(user)
        args = (
            self._now_arg(),
            request_id,
            rates.token_interval_us,
            rates.token_capacity,
            want,
            self._lease_ttl_us,
        )
        try:
            return int(await self._run("charge", self._charge, (tokens_key, concurrency_key), args))
        except _StoreDown:
            if tier.on_store_failure == "closed":
                return 0  # the stream stops with finish_reason "length": nothing vouches for more
            # Fail-open: this instance's share of the budget pays for the rest of the stream.
            return await self._fallback.charge(user, tier, request_id, want)

    async def settle(
        self, user: str, tier: TierLimits, request_id: str, refund: int, *, refund_request: bool = False
    ) -> None:
        rates = self._rates_for(tier)
        args = (
            self._now_arg(),
            request_id,
            rates.token_interval_us,
            refund,
            rates.request_interval_us,
            int(refund_request),
        )
        try:
            await self._run("settle", self._settle, user_keys(user), args)
        except _StoreDown:
            # The slot expires with its lease TTL; the unused reservation is not refunded (the
            # safe side: the user is under-, never over-served).
            log.warning("limiter_settle_skipped", request_id=request_id)

    async def aclose(self) -> None:
        await self._client.aclose()
