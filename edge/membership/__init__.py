"""Edges that count themselves (issue 14, item 2): every edge instance registers in Redis with a
heartbeat and a TTL, and derives from the live members what it used to read from the static
`instance_count` setting: the share it may fill of every replica the edges share (Triton hosts; an
edge's own local engines are its alone, not divided), and the divisor of the fail-open limiter's
limits. `instance_count` remains the fallback when Redis has been unreachable too long.
A member that stops beating is departed: the others free its users' concurrency slots.

    registry.py   the Redis side: one atomic script per beat (purge the dead, write my claim, read all)
    shares.py     the arithmetic: claims -> my share and the fallback divisor (pure)
    assignment.py which members divide which replica, with [fleet] members_per_replica (rankings
                  kept across views)
    membership.py the loop: beats, join and drain, staleness, callbacks for the edge to apply
"""

from edge.membership.membership import FleetMembership, MembershipSettings
from edge.membership.shares import FleetView

__all__ = ["FleetMembership", "FleetView", "MembershipSettings"]
