"""The fleet's membership in Redis: a sorted set of expiries, a hash of claims and a sorted set of
departed members under one hash tag (so a Redis Cluster keeps them on one shard), changed only by
heartbeat.lua. A member that stops beating is gone one TTL later, whoever beats next, and departed
(its slots freed, limiter/scripts/admit.lua) until `remember_s` later or its next beat. A silence of
the whole fleet longer than `quiet_s` was Redis's (an outage), not the members': it does not count
against their TTLs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

SCRIPT = resources.files("edge.membership").joinpath("heartbeat.lua").read_text()


@dataclass(frozen=True)
class Fleet:
    claims: dict[str, float]  # every live member's claim
    departed: tuple[str, ...]  # the tags of members that stopped beating (sorted)
    # The beat brought the member back after another's counted it out (a stall past its TTL): the
    # others may have freed its running requests' slots and taken its share meanwhile. Said again
    # at the next beat if the answer that said it first was lost (heartbeat.lua).
    back: bool = False
    # Redis held no entry of the member before the beat: its first, one that brings it back, or a
    # Redis that lost the fleet (restarted empty), where the others have yet to register again.
    unknown: bool = False
    # Made by the first beat on a Redis without the fleet's keys: another after that one, Redis
    # lost the fleet; the same, a member unknown to it was counted out (heartbeat.lua).
    epoch: str = ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class MembershipRegistry:
    def __init__(
        self,
        client: Redis | RedisCluster,
        fleet: str = "edges",
        remember_s: float = 300.0,
        quiet_s: float = 7.5,
        bound_s: float | None = None,
    ) -> None:
        """`remember_s`: how long a departed member's slots may still be held (the limiter's slot
        TTL); it is remembered as departed that long. `quiet_s`: a time with no beat from any
        member that only an outage explains (MembershipSettings.quiet_s). `bound_s`: the longest a
        beat or a leave may wait for Redis (TimeoutError past it), whatever the client retries: a
        Redis Cluster client's retries (a topology refresh, each node tried again) stacked four of
        its timeouts or more on one beat to a silent cluster, against one for a plain client."""
        self._client = client
        self._bound_s = bound_s
        tag = "{floodgate:" + fleet + "}"
        self._keys = [
            f"{tag}:expiry",
            f"{tag}:claims",
            f"{tag}:departed",
            f"{tag}:last-beat",
            f"{tag}:back",
            f"{tag}:epoch",
        ]
        self._remember_ms = max(1, int(remember_s * 1000))
        self._quiet_ms = max(1, int(quiet_s * 1000))
        self._script: Any = client.register_script(SCRIPT)
        # Members told they are back, to say at their next beat that they heard (heartbeat.lua tells
        # them until then: the answer that told them first may have been lost).
        self._heard_back: set[str] = set()

    async def beat(self, member: str, claim: float, ttl_s: float) -> Fleet:
        """Renew `member` with `claim`; every live member's claim (this one's included), the
        departed members' tags, and whether `member` is back after being counted out."""
        return await self._run(member, claim, ttl_s, leave=False)

    async def leave(self, member: str) -> Fleet:
        """Remove `member` at once (a drained instance; a crashed one just stops beating)."""
        return await self._run(member, 0.0, 0.0, leave=True)

    async def _run(self, member: str, claim: float, ttl_s: float, *, leave: bool) -> Fleet:
        ttl_ms = max(1, int(ttl_s * 1000))
        args = [member, repr(float(claim)), ttl_ms, "1" if leave else "0", ttl_ms * 10, self._remember_ms]
        args += [self._quiet_ms, "1" if member in self._heard_back else "0"]
        async with asyncio.timeout(self._bound_s):
            flat, departed, back, unknown, epoch = await self._script(keys=self._keys, args=args)
        if int(back):
            self._heard_back.add(member)
        else:
            self._heard_back.discard(member)
        pairs = [_text(x) for x in flat]
        claims = {pairs[i]: float(pairs[i + 1]) for i in range(0, len(pairs), 2)}
        departed_tags = tuple(sorted(_text(x) for x in departed))
        return Fleet(claims, departed_tags, bool(int(back)), bool(int(unknown)), _text(epoch))
