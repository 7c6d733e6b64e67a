"""The fleet's membership in Redis: a sorted set of expiries and a hash of claims under one hash
tag (so a Redis Cluster keeps them on one shard), changed only by heartbeat.lua. A member that
stops beating is gone one TTL later, whoever beats next."""

from __future__ import annotations

from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

SCRIPT = resources.files("edge.membership").joinpath("heartbeat.lua").read_text()


class MembershipRegistry:
    def __init__(self, client: Redis | RedisCluster, fleet: str = "edges") -> None:
        self._client = client
        tag = "{floodgate:" + fleet + "}"
        self._keys = [f"{tag}:expiry", f"{tag}:claims"]
        self._script: Any = client.register_script(SCRIPT)

    async def beat(self, member: str, claim: float, ttl_s: float) -> dict[str, float]:
        """Renew `member` with `claim`; every live member's claim (this one's included)."""
        return await self._run(member, claim, ttl_s, leave=False)

    async def leave(self, member: str) -> dict[str, float]:
        """Remove `member` at once (a drained instance; a crashed one just stops beating)."""
        return await self._run(member, 0.0, 0.0, leave=True)

    async def _run(self, member: str, claim: float, ttl_s: float, *, leave: bool) -> dict[str, float]:
        ttl_ms = max(1, int(ttl_s * 1000))
        flat = await self._script(
            keys=self._keys, args=[member, repr(float(claim)), ttl_ms, "1" if leave else "0", ttl_ms * 10]
        )
        pairs = [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
        return {pairs[i]: float(pairs[i + 1]) for i in range(0, len(pairs), 2)}
