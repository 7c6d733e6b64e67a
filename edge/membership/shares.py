"""From the members' claims to what one instance may use.

A claim is how many "instance shares" of every replica a member holds: 1 while it serves (and
while it joins: the others make room before it takes any), the fraction of its share its
remaining streams still hold while it drains (falling to 0), nothing once it is gone. Every
instance divides each replica by the sum of the claims, so

* on join, the others shrink within one beat while the newcomer waits one beat before it takes
  its share: the shares never add up to more than the replica (no double booking);
* on drain, the leaver's claim follows its streams down and the others grow as its streams end:
  no slot sits idle waiting for a timeout, none is booked twice;
* a crashed member keeps its claim until its TTL runs out: its streams died with it, so that
  window is the one idle window left, at most one TTL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

State = Literal["joining", "serving", "draining"]


@dataclass(frozen=True)
class FleetView:
    live: int  # members Redis holds (joining, serving, draining)
    total_claims: float
    share: float  # fraction of every replica this instance may fill with new work (0 unless serving)
    held: float  # fraction of every replica its streams may hold now (a drainer's falls to 0)
    divisor: int  # the fail-open limiter divides each limit by this
    source: str  # "redis", "stale" (last view, Redis unreachable) or "fallback" (instance_count)
    # The tags of members that stopped beating, whose concurrency slots are freed (registry.py).
    departed: tuple[str, ...] = ()


def view_from_claims(
    claims: dict[str, float], me: str, state: State, departed: tuple[str, ...] = ()
) -> FleetView:
    total = sum(max(0.0, c) for c in claims.values())
    mine = min(1.0, max(0.0, claims.get(me, 0.0)) / total) if total > 0 else 0.0
    share = mine if state == "serving" else 0.0
    held = 0.0 if state == "joining" else mine
    # Round up: a draining member's remaining streams still count, so the limits are divided by at
    # least as many instances as may admit or finish work; never more than the fleet's limit.
    divisor = max(1, math.ceil(total - 1e-9))
    return FleetView(len(claims), total, share, held, divisor, "redis", departed)


def fallback_view(instance_count: int) -> FleetView:
    """What the static setting says, for when Redis has been unreachable longer than it may be."""
    share = 1.0 / instance_count
    return FleetView(instance_count, float(instance_count), share, share, instance_count, "fallback")
