"""Which members divide which replica, with `[fleet] members_per_replica` (K): each replica among
the K live members of highest rendezvous weight for it, not among all of them.

Why. Dividing every replica among every member gave each member 1 / N of each: at hundreds of
edge processes (one worker per vCPU) a few thousand KV tokens of a replica of hundreds of
thousands, so a request charged more than that fitted no member anywhere, answered no_replica
(with a Retry-After) for ever, and below that wall a member held about one long request per
replica. Among K members, each of a replica's members holds 1 / K of it.

Rendezvous (highest random weight) hashing of (member, replica): every member computes the same
subsets from the same live members, needing nothing more in Redis; a replica's subset depends only
on the live members and its own name, so members that discovered replicas at different times
still agree on each; and a member that joins or leaves changes only the subsets it ranks in (about
K / N of the replicas), never reshuffling the rest.

The cost: a member holds nothing of the replicas it is not among, so a member among none (each is
among about K x replicas / members of them, a Poisson count: e^-(K x replicas / members) of the
members are among none) answers every request no_replica. Size K so that K x replicas is a few
times the members (docs/deploy.md).

Cost on the event loop (`Rankings`): every view change asks, for each replica of each model, whether
this member is among its K under each live-member set of the last join wait. Ranking every member
afresh for each (300 members x 300 replicas, a weight cache too small for the pairs) took 115 ms a
view; kept ranked across views, a member set is walked from the top only until K of it (or this
member) turn up, and a join or leave moves one entry per replica.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections.abc import Collection, Set


def weight(member: str, replica: str) -> int:
    """The member's rendezvous weight for the replica: the same in every process (Python's own
    hash() is salted per process, so it would not be)."""
    digest = hashlib.blake2b(f"{member}\0{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Rankings:
    """Each replica's members by rendezvous weight, kept from one view to the next (one per
    FleetMembership): what a view asks of a member set (`top`) then costs a walk down to the set's
    K-th member, not a weight per member, and a change of the members (`rank`) an insertion or a
    removal per replica, not a ranking of everyone again. Ties (a 64-bit collision) go to the
    larger id, so all agree."""

    def __init__(self) -> None:
        self._members: frozenset[str] = frozenset()
        # Per replica: (weight, member) over `_members`, ascending; built when first asked about.
        self._order: dict[str, list[tuple[int, str]]] = {}
        # The replicas asked about since the members last changed: the others (gone from every
        # dispatcher) are forgotten at the next change rather than kept up to date for ever.
        self._asked: set[str] = set()

    def rank(self, members: Collection[str]) -> None:
        """Rank exactly `members` from now on: every set `top` is asked about must be among them
        (the union of the live-member sets a view consults)."""
        new = frozenset(members)
        if new == self._members:
            return
        gone, added = self._members - new, new - self._members
        if self._asked:  # none while joining or on the fallback: nothing tells which are gone
            self._order = {r: order for r, order in self._order.items() if r in self._asked}
        for replica, order in self._order.items():
            for member in gone:
                del order[bisect_left(order, (weight(member, replica), member))]
            for member in added:
                insort(order, (weight(member, replica), member))
        self._members = new
        self._asked = set()

    def top(self, members: Set[str], replica: str, k: int, until: str | None = None) -> list[str]:
        """The `k` of `members` (a subset of those ranked) of highest weight for `replica`,
        highest first (every one when there are no more than `k`; `k` 0: every one), or those
        down to `until` where it comes first."""
        self._asked.add(replica)
        order = self._order.get(replica)
        if order is None:
            order = self._order[replica] = sorted((weight(m, replica), m) for m in self._members)
        found: list[str] = []
        for _, member in reversed(order):
            if member in members:
                found.append(member)
                if member == until or len(found) == k:
                    break
        return found
