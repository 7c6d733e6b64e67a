"""One edge instance's membership loop: beat every `interval_s`, turn the fleet's claims into this
instance's view (shares.py) and hand each new view to `on_change`, which applies it (the
dispatcher's replica share, the fail-open limiter's divisor, the departed members whose slots the
limiter frees).

Join: the first beat registers a full claim, so the others make room at their next beat; this
instance takes new work only `join_wait_s` later (every other member has beaten since, with a late
beat to spare), or at its first beat that reaches Redis after that: with Redis out of reach the
others could not beat. With `members_per_replica` the same holds per replica: one this instance
is newly among (a member there left, or it joined) it takes `join_wait_s` after the beat that
showed it so.
The first member of an empty fleet has nobody to wait for and serves at once. Told by
`instance_count` that the fleet is several, it holds no more than a full fleet would give it (1 /
instance_count, the limits divided by instance_count) for a join wait, by when every live member
has beaten: an empty fleet may be a Redis that just lost it (restarted empty, FLUSHALL, a failover
to an empty replica), whose members register again over their next beat, each still filling its
part meanwhile; taken whole, every replica was booked twice over (a lone edge, instance_count 1,
serves whole at once).
Drain: `begin_drain(remaining)` makes the claim follow `remaining()` (the fraction of its share its
open streams still hold) and takes no new work; `aclose()` leaves at once. Redis
unreachable: the last view holds for `stale_after_s` (the fleet rarely changes in that time; one
that never reached it holds its first, nothing, from its first beat), then
the static `instance_count` takes over until Redis answers again (with `members_per_replica`, for
the limits' divisor; the replicas stay divided as last seen); an outage of Redis itself counts
against nobody's TTL (heartbeat.lua), so the fleet is as it was. A Redis that lost the fleet
(restarted empty) holds only the members that beat since: for a join wait this instance counts the
others it saw before as they were until they register again, or the first to beat took every
replica whole beside the others' shares. Back after the others counted it
out (a stall past `ttl_s`: a frozen VM, a loop blocked, SIGSTOP; or cut off alone, however long:
the fleet's epoch tells it from a Redis that lost the fleet): it joins again as a newcomer,
since they took its share, and has its running requests' slots put back (`on_back`), since their
admits may have freed them as a dead member's. Finding a Redis that lost the fleet (unknown to it,
not counted out), it has them put back too (`on_lost`): that Redis lost the limiter's keys with the
fleet's, its running streams' slots among them, and nothing else tells a limiter whose connections
never broke (FLUSHALL, a key space evicted) or that made no call since (a restart between two).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from edge.membership.assignment import Rankings
from edge.membership.registry import Fleet, MembershipRegistry
from edge.membership.shares import FleetView, State, at_most, fallback_view, view_from_claims
from edge.task_stop import cancelling, stop_task

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class MembershipSettings:
    instance_count: int = 1  # the fallback: what the fleet is assumed to be without Redis
    interval_s: float = 5.0  # between beats
    # A newcomer takes no work until this long after its first beat: every other member has beaten
    # (and made room) by then, with one late beat to spare.
    join_wait_s: float = 10.0
    ttl_s: float = 15.0  # a member that stops beating is gone after this (3 missed beats)
    stale_after_s: float = 30.0  # Redis unreachable this long: instance_count takes over
    # The longest one beat waits for Redis, its client's retries included (registry.py): the
    # client's own timeout; None: interval_s.
    timeout_s: float | None = None
    fleet: str = "edges"
    # A member that stopped beating is departed this long (its slots are freed meanwhile): the
    # limiter's slot TTL, past which its slots have expired anyway.
    remember_departed_s: float = 300.0
    # Each replica divided among this many members (assignment.py); 0: among every member.
    members_per_replica: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.interval_s < self.ttl_s:
            raise ValueError("interval_s must be positive and below ttl_s")
        if self.join_wait_s < self.interval_s:
            raise ValueError("join_wait_s must be at least interval_s")
        if self.instance_count < 1:
            raise ValueError("instance_count must be at least 1")
        if self.members_per_replica < 0:
            raise ValueError("members_per_replica must be 0 (every member) or more")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")

    @property
    def beat_bound_s(self) -> float:
        return self.interval_s if self.timeout_s is None else self.timeout_s

    @property
    def quiet_s(self) -> float:
        """A time with no beat from any member that only an outage of Redis explains (heartbeat.lua
        then moves every expiry on by it). Above one beat period with room to spare, for a member
        alone (its beats are interval_s apart plus their own time) must still count the dead out;
        below the silence that outlasts a TTL (a beat late by up to interval_s), or the members are
        counted out first: half the TTL, between the two where the TTL is 3 beats or more."""
        return max(self.ttl_s / 2, 1.5 * self.interval_s)


class FleetMembership:
    def __init__(
        self,
        client: Redis | RedisCluster,
        member_id: str,
        settings: MembershipSettings,
        on_change: Callable[[FleetView], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_back: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        """`on_back`: called when a beat finds this instance back after the others counted it
        out (a stall past `ttl_s`), and again once it serves: its running requests' slots, which
        their admits may have freed as a dead member's, are to be put back (the limiter's
        `restore_slots`). `on_lost`: called when a beat finds a Redis that lost the fleet (restarted
        empty, FLUSHALL, a failover to an empty replica, its keys evicted) after this instance had
        joined: the limiter's keys went with the fleet's, and its running requests' slots and its
        counts are to be put back (the limiter's `restore_slots` too). Without it a user's streams
        running through a FLUSHALL held no slot until they ended: the user was admitted past their
        concurrency limit, and a cancel that reached another edge or worker answered 404 while the
        stream went on generating."""
        self.member_id = member_id
        self.settings = settings
        self._registry = MembershipRegistry(
            client, settings.fleet, settings.remember_departed_s, settings.quiet_s, settings.beat_bound_s
        )
        self._on_change = on_change
        self._on_back = on_back
        self._on_lost = on_lost
        # Back from being counted out, the slots put back once more when this instance serves:
        # until their next beat, the others' views still name it departed.
        self._restore_when_serving = False
        self._clock = clock
        self._joined_at: float | None = None  # first beat Redis accepted
        # The first member of a fleet found empty holds at most 1 / instance_count until then.
        self._bounded_until = 0.0
        self._last_ok: float | None = None
        self._first_try: float | None = None  # the first beat's start, reaching Redis or not
        self._fleet = Fleet({}, ())
        # The live-member sets the beats found over the last join wait, each with when it was
        # first seen (the current one last): with members_per_replica, a replica this member is
        # newly among is taken once every other member there has beaten since (shares.Subsets).
        self._sets: list[tuple[float, frozenset[str]]] = []
        # Every replica's members in rank order, kept across views: ranking them afresh at each
        # view stalled the event loop (assignment.py).
        self._rankings = Rankings()
        # Redis lost the fleet: the other members last seen, counted with their last claims until
        # they register again or `_kept_until` (a join wait: every live one has beaten by then).
        self._kept: dict[str, float] = {}
        self._kept_until = 0.0
        # The epoch of the fleet as this member last reached it (heartbeat.lua): unknown to Redis
        # under the same one, it was counted out; under another, Redis lost the fleet.
        self._epoch = ""
        self._remaining: Callable[[], float] | None = None  # set while draining
        self._task: asyncio.Task[None] | None = None
        # Until the first beat: nothing known, no new work (start() settles it either way).
        self.view = FleetView(0, 0.0, 0.0, 0.0, settings.instance_count, "fallback")

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> FleetView:
        """Register (one beat), then beat in the background. Returns the first view."""
        await self.beat_once()
        self._task = asyncio.create_task(self._loop(), name="fleet-membership")
        return self.view

    def begin_drain(self, remaining: Callable[[], float]) -> None:
        """Take no new work; claim `remaining()` (0..1) of a share from now on, recomputed each beat."""
        self._remaining = remaining
        self._set(replace(self.view, share=0.0))

    async def aclose(self) -> None:
        """Stop beating and leave the fleet at once (the others grow at their next beat)."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        with contextlib.suppress(RedisError, RedisClusterException, OSError, TimeoutError):
            await self._registry.leave(self.member_id)

    # -- the beat ------------------------------------------------------------------------------
    @property
    def joining(self) -> bool:
        return self._joined_at is None or self._clock() - self._joined_at < self.settings.join_wait_s

    def _claim(self) -> float:
        if self._remaining is None:
            return 1.0
        return min(1.0, max(0.0, float(self._remaining())))

    async def beat_once(self) -> FleetView:
        now = self._clock()
        if self._first_try is None:
            self._first_try = now
        claim = self._claim()
        claimed = self.member_id in self._fleet.claims
        if self._remaining is not None and claimed and self.view.source == "redis":
            # Draining: hold the smaller claim here before Redis shows it to the others, who grow
            # as soon as they see it. Lowered after the write, the two views overlapped for as long
            # as the reply took: the shares summed past the whole replica (1.014 in one CI run).
            claims = {**self._fleet.claims, self.member_id: claim}
            self._set(self._view(claims, "draining"))
        try:
            fleet = await self._registry.beat(self.member_id, claim, self.settings.ttl_s)
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            if cancelling():
                raise asyncio.CancelledError from exc  # a stop that the Redis call turned into this
            return self._unreachable(now, exc)
        if (
            fleet.unknown
            and not fleet.back
            and self._joined_at is not None
            and fleet.epoch == self._epoch
            and self._silent_past_ttl(now)
        ):
            # Unknown to the fleet it had joined, not lost with it: cut off alone past
            # remember_departed_s, counted out (its share taken, its slots freed) and forgotten
            # since, so Redis no longer says it is back. Read as a Redis that lost the fleet, it
            # served at once beside the others' whole shares and never put its slots back.
            fleet = replace(fleet, back=True)
        self._epoch = fleet.epoch
        if fleet.unknown and not fleet.back and self._joined_at is not None:
            # Redis lost the fleet (_keeping_lost), and the limiter's keys with it.
            log.warning("fleet_lost_by_redis", member=self.member_id, epoch=fleet.epoch)
            if self._on_lost is not None:
                self._on_lost()
        self._fleet = self._keeping_lost(now, fleet)
        alone = set(self._fleet.claims) <= {self.member_id}
        back = self._fleet.back and self._joined_at is not None
        if self._joined_at is None and alone:
            # The first member of an empty fleet: nobody has to make room, so no wait (one edge
            # alone serves at once). A later joiner finds this claim and waits for it to shrink.
            self._joined_at = now - self.settings.join_wait_s
            # Nothing in an empty Redis tells a new fleet from one Redis just lost, whose members
            # register again at their next beats (each still filling its part meanwhile): one told
            # the fleet is several holds what a full fleet would give it until all have beaten.
            # Waiting its join beats instead delayed every fresh `serve --workers N` by two beats.
            if self.settings.instance_count > 1:
                self._bounded_until = now + self.settings.join_wait_s
        elif self._joined_at is None or (back and not alone):
            # (Re)joining: after a stall past the TTL, or cut off from Redis alone for that long,
            # the others counted this member out and took its share; it takes it back once they
            # have made room again. Not after an outage of Redis itself, however long (the fallback
            # included): nobody could beat, nobody was counted out (heartbeat.lua), and every
            # member sent back through the join wait at once left the fleet serving nothing.
            self._joined_at = now
        self._last_ok = now
        self._saw(now, frozenset(self._fleet.claims))
        if back:
            log.warning("fleet_member_back", member=self.member_id, alone=alone)
            self._restore_when_serving = not alone
            if self._on_back is not None:
                self._on_back()
        return self._recompute()

    def _silent_past_ttl(self, now: float) -> bool:
        """Whether this member's last beat that reached Redis is `ttl_s` old or more, so that the
        others may have counted it out: its entry expired no sooner than `ttl_s` after that beat
        began. Unknown to Redis sooner than that, Redis lost its entry (a maxmemory policy evicting
        the fleet's keys but its epoch, a key deleted by hand): every member finds the same at its
        next beat, and taken for counted out, each one went through the join wait at once, the
        fleet serving nothing for join_wait_s."""
        return self._last_ok is None or now - self._last_ok >= self.settings.ttl_s

    def _keeping_lost(self, now: float, fleet: Fleet) -> Fleet:
        """`fleet` with the members a Redis that lost the fleet no longer holds: unknown to Redis
        though nobody counted it out, after it had joined, this instance finds a Redis restarted
        empty (or whose keys expired), where the others register again one by one over the next
        beat, each still filling its part meanwhile. Counted out of what Redis holds, they made
        the first to beat take every replica whole beside them."""
        if fleet.unknown and not fleet.back and self._joined_at is not None:
            self._kept = {m: c for m, c in self._fleet.claims.items() if m != self.member_id}
            self._kept_until = now + self.settings.join_wait_s
        if now >= self._kept_until:
            self._kept = {}
        self._kept = {m: c for m, c in self._kept.items() if m not in fleet.claims}
        return replace(fleet, claims={**self._kept, **fleet.claims}) if self._kept else fleet

    def _recompute(self) -> FleetView:
        state: State = "draining" if self._remaining is not None else "joining" if self.joining else "serving"
        if state == "serving" and self._restore_when_serving:
            self._restore_when_serving = False
            if self._on_back is not None:
                self._on_back()
        return self._set(self._view(self._fleet.claims, state))

    def _view(self, claims: dict[str, float], state: State) -> FleetView:
        k = self.settings.members_per_replica
        self._forget_sets(self._clock())
        recent = tuple(members for _, members in self._sets)
        departed = self._fleet.departed
        view = view_from_claims(claims, self.member_id, state, departed, k, recent, self._rankings)
        if self._clock() < self._bounded_until:
            # Its beats so far may show some of a fleet Redis lost registered again and not
            # others, whose old parts it would take (its share among those it sees).
            view = at_most(view, self.settings.instance_count)
        return view

    def _saw(self, now: float, members: frozenset[str]) -> None:
        if not self._sets or self._sets[-1][1] != members:
            self._sets.append((now, members))

    def _forget_sets(self, now: float) -> None:
        """Keep the live-member sets seen since the join wait before `now`, and the one current
        then: a set that gave way before the window began no longer holds anyone back."""
        start = now - self.settings.join_wait_s
        while len(self._sets) > 1 and self._sets[1][0] <= start:
            self._sets.pop(0)

    def _unreachable(self, now: float, exc: BaseException) -> FleetView:
        # One that never reached Redis holds its first view (nothing, as a joiner) as long as the
        # others hold their last: falling back at its first failed beat, it took 1 / instance_count
        # of every replica (all of each at the default 1) beside their whole shares, with no join
        # wait, while Redis merely answered late once.
        since = self._last_ok if self._last_ok is not None else self._first_try
        if since is not None and now - since < self.settings.stale_after_s:
            view = replace(self.view, source="stale")
        else:
            view = fallback_view(self.settings.instance_count)
            if self.view.subsets is not None and self.view.held > 0:
                # members_per_replica: 1 / instance_count of every replica was the wall K removes
                # (a request past it fitted nowhere for the whole outage). One that took part
                # keeps each replica's division among its members as last seen, as the others
                # cut off with it keep theirs; one that never did (joining) knows no division.
                view = replace(view, subsets=self.view.subsets)
            if self._remaining is not None:
                view = replace(view, share=0.0)
        if view.source != self.view.source:
            log.warning("fleet_membership_unreachable", source=view.source, error=type(exc).__name__)
        return self._set(view)

    def _set(self, view: FleetView) -> FleetView:
        changed = view != self.view
        self.view = view
        if changed and self._on_change is not None:
            self._on_change(view)
        return view

    async def _loop(self) -> None:
        while True:
            delay = self.settings.interval_s
            if self._joined_at is not None and self.joining:
                # Take the share as soon as every other member has beaten once since the join.
                until = self._joined_at + self.settings.join_wait_s - self._clock()
                await asyncio.sleep(max(0.0, min(delay, until)))
                if self._clock() - self._joined_at >= self.settings.join_wait_s:
                    # The wait stands for the others having beaten since and made room, which
                    # with Redis out of reach they could not: the join ends at a beat that
                    # reaches it. Served meanwhile, this member kept its part of its replicas
                    # beside their members for the whole outage (the fallback keeps the division).
                    if self.view.source == "redis":
                        self._recompute()
                    continue
                await self.beat_once()
                continue
            await asyncio.sleep(delay)
            await self.beat_once()
