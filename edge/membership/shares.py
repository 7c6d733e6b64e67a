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

With `[fleet] members_per_replica` (K, assignment.py) each replica is divided so among its K
members only (`FleetView.held_of`), and the same promises hold per replica: a member that a change
of the live members puts among a replica's K (it joined; one of them left and it ranks next) takes
none of it until it has seen itself there for a join wait (`Subsets.recent`), by when the others
there have seen the change and made room; a drainer's claim falls on each of its replicas as its
streams end. What can overbook, transiently and bounded, is what the global division also has:
* a member that a joiner pushes out of a replica takes no new work there from its next beat, but
  its running streams keep their room until they end: at most its old part of that replica
  (1 / K) over, for as long as those streams last, as the global division's members shrinking
  from 1 / N to 1 / (N + 1) overrun by 1 / (N + 1) in all on a join;
* a change the members see one beat apart (a member leaving) leaves their views of one replica
  unalike for up to a beat;
* a Redis that lost the fleet (restarted empty, FLUSHALL, a failover to an empty replica) looks
  like a new fleet to a newcomer that beats before the others register again: it serves at once,
  as the first member of an empty fleet does, but with instance_count > 1 holds at most 1 /
  instance_count (`at_most`) until every member has beaten, over by that much for up to a beat
  beside the others' old parts (with instance_count 1, the lone edge's default, by its whole share);
* Redis out of reach past `stale_after_s`, a member that took part keeps each replica's division
  as it last saw it (membership.py), not 1 / instance_count of every one: in an outage of Redis
  every member does, and the division stays whole. One cut off alone, whom the others counted out
  and whose replicas they gave its successors, holds its old part of those (1 / K each) beside
  them for as long as it stays cut off, where 1 / instance_count of every replica overbooked each
  a little: the same room in all, on fewer replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from edge.membership.assignment import Rankings

State = Literal["joining", "serving", "draining"]


@dataclass(frozen=True)
class Subsets:
    """What dividing each replica among `k` members takes (assignment.py): every live member's
    claim, and the live-member sets this member saw over the last join wait (the current one
    last): a replica it is newly among stays at 0 until every set shows it there. `rankings`
    ranks every member of those sets (view_from_claims sees to it), kept across views: a later
    view may re-rank them, by when this one is no longer applied."""

    me: str
    k: int
    claims: tuple[tuple[str, float], ...]
    recent: tuple[frozenset[str], ...]
    rankings: Rankings = field(compare=False, repr=False)
    # `claims` to look up, made once: a view asks about every replica of every model.
    _claim_of: dict[str, float] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_claim_of", dict(self.claims))

    def part_of(self, replica: str) -> float:
        """Its claim over the claims of the replica's members, 0 where it is not among them (or
        not yet under every recent set): the parts of a replica's members sum to at most 1."""
        for members in self.recent:
            if self.me not in self.rankings.top(members, replica, self.k, until=self.me):
                return 0.0
        claims = self._claim_of
        among = self.rankings.top(claims.keys(), replica, self.k)
        total = sum(max(0.0, claims[m]) for m in among)
        mine = max(0.0, claims.get(self.me, 0.0))
        return min(1.0, mine / total) if total > 0 else 0.0


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
    # With members_per_replica: each replica among a few members; None: every one among all.
    subsets: Subsets | None = None
    # The most it holds of any replica (`at_most`): 1 / instance_count while the fleet it found
    # empty may be one Redis just lost; 1 otherwise.
    most: float = 1.0

    def held_of(self, replica: str) -> float:
        """The fraction of `replica` this instance's streams may hold now: `held` of every one, or
        with members_per_replica its part of this one (0 where it is not among its members), and
        0 wherever `held` is (joining; draining once Redis is out of reach); never above `most`."""
        if self.subsets is None or self.held == 0.0:
            return self.held
        return min(self.most, self.subsets.part_of(replica))


def view_from_claims(
    claims: dict[str, float],
    me: str,
    state: State,
    departed: tuple[str, ...] = (),
    members_per_replica: int = 0,
    recent: tuple[frozenset[str], ...] = (),
    rankings: Rankings | None = None,
) -> FleetView:
    """`share`, `held` and `divisor` count every live member whatever `members_per_replica`: the
    limiter's divisor is the fleet's, and `share` says whether this member takes new work at all
    (/readyz). `recent`: the live-member sets seen over the last join wait (Subsets); the current
    one alone when not given. `rankings`: the member's own, kept across its views (a new one
    when not given)."""
    total = sum(max(0.0, c) for c in claims.values())
    mine = min(1.0, max(0.0, claims.get(me, 0.0)) / total) if total > 0 else 0.0
    share = mine if state == "serving" else 0.0
    held = 0.0 if state == "joining" else mine
    # Round up: a draining member's remaining streams still count, so the limits are divided by at
    # least as many instances as may admit or finish work; never more than the fleet's limit.
    divisor = max(1, math.ceil(total - 1e-9))
    subsets = None
    if members_per_replica > 0:
        recent = recent or (frozenset(claims),)
        rankings = rankings if rankings is not None else Rankings()
        rankings.rank(frozenset(claims).union(*recent))
        subsets = Subsets(me, members_per_replica, tuple(sorted(claims.items())), recent, rankings)
    return FleetView(len(claims), total, share, held, divisor, "redis", departed, subsets)


def at_most(view: FleetView, instance_count: int) -> FleetView:
    """`view` holding no more than a full fleet of `instance_count` would give this member: 1 /
    instance_count of each replica (with members_per_replica, of those it is among) and the limits
    divided by at least instance_count. For the first member of a fleet that looked empty, which
    a Redis that just lost the fleet looks like too (membership.py)."""
    most = min(view.most, 1.0 / instance_count)
    return replace(
        view,
        share=min(view.share, most),
        held=min(view.held, most),
        divisor=max(view.divisor, instance_count),
        most=most,
    )


def fallback_view(instance_count: int) -> FleetView:
    """What the static setting says, for when Redis has been unreachable longer than it may be."""
    share = 1.0 / instance_count
    return FleetView(instance_count, float(instance_count), share, share, instance_count, "fallback")
