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
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Collection, Iterable, Mapping
from functools import lru_cache

# (member, replica) pairs whose weight is remembered: a view is applied to every replica of every
# model at each change, each ranking every live member (hundreds).
_WEIGHTS_KEPT = 1 << 16


@lru_cache(maxsize=_WEIGHTS_KEPT)
def weight(member: str, replica: str) -> int:
    """The member's rendezvous weight for the replica: the same in every process (Python's own
    hash() is salted per process, so it would not be)."""
    digest = hashlib.blake2b(f"{member}\0{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assigned(members: Iterable[str], replica: str, k: int) -> frozenset[str]:
    """The members that divide `replica`: the `k` of highest weight, every one when `k` is 0 or
    there are no more than `k`. Ties (a 64-bit collision) go to the larger id, so all agree."""
    pool = list(members)
    if k <= 0 or len(pool) <= k:
        return frozenset(pool)
    return frozenset(heapq.nlargest(k, pool, key=lambda m: (weight(m, replica), m)))


def replica_share(claims: Mapping[str, float], me: str, replica: str, k: int) -> float:
    """`me`'s part of `replica`: its claim over the claims of the replica's members, 0 when it is
    not among them. The parts of a replica's members sum to 1 (or 0 when none claims anything)."""
    members = assigned(claims, replica, k)
    if me not in members:
        return 0.0
    total = sum(max(0.0, claims[m]) for m in members)
    mine = max(0.0, claims.get(me, 0.0))
    return min(1.0, mine / total) if total > 0 else 0.0


def settled(recent: Iterable[Collection[str]], me: str, replica: str, k: int) -> bool:
    """Whether `me` was among `replica`'s members under each of the `recent` live-member sets (those
    it saw over the last join wait, the current one included): only then has every other member of
    the replica beaten since the change that put `me` there, and made room for it."""
    return all(me in assigned(members, replica, k) for members in recent)
