"""The GPU replicas this edge sends work to: their health, their membership, and their drain.

Health. Every `poll_interval_s` each replica's ready() and capacity() are polled, all replicas at
once, each bounded by `health_timeout_s`; failing either takes it out. A replica whose generation
failed (`Slot.release(failed=True)`) gets no new work until a health check that started after the
failure passes; requests already waiting for it keep waiting meanwhile. A replica that is down but
whose upstream restarts it itself (the local engine process: `Restarts.back_in_s`) is kept as
coming back, `Replica.back_in_s`: requests may wait for it (the dispatcher), and it is checked
again when it is expected back rather than a whole poll interval later.

Membership. Replicas come and go while the edge runs (`add`, `remove`: replica discovery calls them
through the dispatcher). An added replica is health-checked at once. A removed one drains: it takes
no new tickets, its in-flight generations finish, then its upstream is closed.

What the polls found is kept here and read by everyone else (`states()`): readiness and /metrics
never wait on a replica themselves, so a hung one cannot fail the edge's own health check.

After anything that may change where tickets can go (a check, a join, a leave, a release), the set
calls `on_change`: the dispatcher then reconsiders its queue. `take_lost_room()` tells it whether
some waiters may have lost every replica that could ever hold them.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from edge.admission import metrics
from edge.admission.replica import Replica
from edge.admission.service_rate import ServiceRate
from edge.task_stop import stop_task
from edge.upstreams.base import Capacity, Upstream

log = structlog.get_logger("floodgate.admission")


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica as the last health poll found it, plus what this edge holds on it now."""

    name: str
    alive: bool  # passed its last health check
    placeable: bool  # alive and not suspect: takes new work
    capacity: Capacity | None  # as last polled (None: never answered)
    kv_tokens_held: int  # by this edge's in-flight requests
    sequences_held: int
    # The served model it is a replica of (the dispatcher's `model`: "" on an edge serving one).
    # Names alone do not say: a remote Triton replica is `triton-host:port` whatever it serves.
    model: str = ""


class ReplicaSet:
    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        on_change: Callable[[], None],
        poll_interval_s: float,
        health_timeout_s: float,
        prior_service_s: float,
        replica_share: float,
        fallback_block_tokens: int,
        model: str = "",
    ) -> None:
        names = [u.name for u in upstreams]
        if len(set(names)) != len(names):
            raise ValueError("upstream names must be unique")
        self._on_change = on_change
        self._poll_interval_s = poll_interval_s
        self._health_timeout_s = health_timeout_s
        self._prior_service_s = prior_service_s
        # This edge's share of a replica, by name: the same for every one until the fleet says
        # otherwise (set_shares), and for one discovered later.
        self._share_of: Callable[[str], float] = lambda _name: replica_share
        self._fallback_block_tokens = fallback_block_tokens
        # Its replicas' gauges and states carry it: their names do not say which model they serve.
        self.model = model
        # The members that may take new tickets; removed ones wait in _draining until they are empty.
        self.members: list[Replica] = [self._new_replica(u) for u in upstreams]
        self._draining: list[Replica] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._checks_started = 0
        self._lost_room = False
        self._poller: asyncio.Task[None] | None = None
        self.closed = False
        # The smallest sequence limit (prompt + reply) a member reports (Capacity.max_sequence_tokens;
        # 0: none reports one): the pipeline's context for every request, which may go to any member.
        # Kept here, with each poll and membership change, so a request reads one number.
        self.max_sequence_tokens = 0

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Poll every replica once (so the first request finds their capacity), then keep polling."""
        await self.check_all()
        self._poller = asyncio.create_task(self._poll_forever(), name="admission-health-poll")

    async def aclose(self) -> None:
        self.closed = True
        if self._poller is not None:
            await stop_task(self._poller)
            self._poller = None
        for replica in self._draining:
            self._close_removed(replica)
        self._draining.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- reading ---------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The replicas that may take new tickets (draining ones excluded)."""
        return [r.name for r in self.members]

    def filled(self) -> int:
        """The members this edge may fill any of (its share there above 0)."""
        return sum(1 for r in self.members if r.share > 0)

    def alive(self) -> list[Replica]:
        return [r for r in self.members if r.alive]

    def states(self) -> list[ReplicaState]:
        """Every member as last polled: what readiness and the operator endpoints report."""
        return [
            ReplicaState(r.name, r.alive, r.placeable, r.capacity, r.kv_in_use, r.sequences, self.model)
            for r in self.members
        ]

    def take_lost_room(self) -> bool:
        """Whether health or membership changed so that some waiters may fit nowhere now (resets)."""
        lost, self._lost_room = self._lost_room, False
        return lost

    def set_shares(self, share_of: Callable[[str], float]) -> None:
        """Fill `share_of(name)` of each replica from now on, and of each one added later
        (edge/membership/: the fleet changed; with members_per_replica each replica has its own).
        Requests already running keep their room; a smaller share only takes new work later."""
        shares = {r.name: share_of(r.name) for r in self.members + self._draining}
        if any(not 0.0 <= share <= 1.0 for share in shares.values()):
            raise ValueError("replica share must be in [0, 1]")
        self._share_of = share_of
        for replica in self.members + self._draining:
            share = shares[replica.name]
            if share < replica.share:
                self._lost_room = True  # some waiters may no longer fit in this edge's smaller part
            replica.share = share
        self._on_change()

    # -- membership ------------------------------------------------------------------------------

    async def add(self, upstream: Upstream) -> None:
        """Start sending work to a new replica once its first health check (done here) passes."""
        if self.closed:
            raise RuntimeError("the dispatcher is closed")
        if any(r.name == upstream.name for r in self.members):
            raise ValueError(f"a replica named {upstream.name!r} is already a member")
        replica = self._new_replica(upstream)
        self.members.append(replica)
        log.info("replica_added", replica=replica.name)
        self._checks_started += 1
        # Its first answer loses no room: coming up is a gain, and failing waiters on it beside the
        # other replicas' last answers failed one that a poll under way was finding a home for.
        await self._check(replica, self._checks_started)
        self._on_change()

    def remove(self, name: str) -> None:
        """Drain a replica: no new tickets from now on; its upstream is closed after the last
        in-flight generation on it releases its slot."""
        replica = next((r for r in self.members if r.name == name), None)
        if replica is None:
            raise KeyError(name)
        self.members.remove(replica)
        metrics.forget_replica(self.model, replica.name)
        log.info("replica_removed", replica=name, in_flight=replica.sequences)
        if replica.sequences == 0:
            self._close_removed(replica)
        else:
            self._draining.append(replica)
        self._lost_room = True  # waiters that only this replica could hold now fail
        self._note_sequence_limits()
        self._on_change()

    def released(self, replica: Replica, *, failed: bool, held_s: float | None, request_id: str) -> None:
        """A slot on `replica` was given back (the dispatcher has already uncounted it).
        `held_s`: how long a generation that ran held it (teaches the service rate)."""
        if failed:
            if replica.suspect_since_check is None:
                log.warning("replica_suspect", replica=replica.name, request_id=request_id)
            replica.suspect_since_check = self._checks_started
        elif held_s is not None:
            replica.rate.observe(held_s)
        if replica.sequences == 0 and replica in self._draining:
            self._draining.remove(replica)
            self._close_removed(replica)

    def _new_replica(self, upstream: Upstream) -> Replica:
        replica = Replica(
            upstream,
            ServiceRate(self._prior_service_s),
            self._share_of(upstream.name),
            fallback_block_tokens=self._fallback_block_tokens,
        )
        metrics.watch_replica(self.model, replica.name, replica.utilisation)
        return replica

    def _close_removed(self, replica: Replica) -> None:
        # An empty context: started where the replica's last stream gave its slot back, the close
        # is the replica's, not that request's (its request_id must not be bound to these lines).
        task = asyncio.create_task(
            self._close_upstream(replica), name=f"close-{replica.name}", context=contextvars.Context()
        )
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_upstream(replica: Replica) -> None:
        try:
            await replica.upstream.aclose()
        except Exception as exc:  # a replica that is gone may fail to close cleanly; nothing to do
            log.warning("replica_close_failed", replica=replica.name, error=type(exc).__name__)
        else:
            log.info("replica_closed", replica=replica.name)

    # -- health ----------------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._next_poll_s())
            await self.check_all()

    def _next_poll_s(self) -> float:
        """The poll interval, or less when a restarting replica is expected back sooner: requests
        waiting for it are placed once a check finds it ready, and a whole interval more would be
        part of their wait. Never under a tenth of the interval, so one that is overdue is looked
        at ten times as often, not in a loop."""
        backs = [r.back_in_s for r in self.members if r.back_in_s is not None]
        if not backs:
            return self._poll_interval_s
        return min(self._poll_interval_s, max(min(backs), self._poll_interval_s / 10))

    async def check_all(self) -> None:
        """Poll every replica's health and capacity now, all at once (start() and the poller).
        Each answer places waiters when it comes: a replica whose check passed (its failure mark
        cleared, back from a restart) takes its waiters then, not once the slowest check ended
        (one that hangs: health_timeout_s, while requests waited beside an idle replica). What
        the answers say of room lost (waiters that may fit nowhere now, which are then failed) is
        acted on once every answer is in: judged on one replica's answer beside another's stale
        one, a waiter whose replica was last seen restarting past its wait, and found back later
        in the same poll, was failed (a review)."""
        self._checks_started += 1
        check = self._checks_started
        lost = False

        async def check_one(replica: Replica) -> None:
            nonlocal lost
            lost |= await self._check(replica, check)
            self._on_change()

        await asyncio.gather(*(check_one(replica) for replica in list(self.members)))
        self._lost_room |= lost
        self._on_change()

    async def _check(self, replica: Replica, check: int) -> bool:
        """Take in one replica's answer; whether it lost room (some waiters may fit nowhere now)."""
        # Read before ready() too: a child that comes up between ready() and the read after it
        # answers None there, which alone would read as a restart that failed (its waiters fail).
        back_before = _back_in_s(replica.upstream)
        try:
            async with asyncio.timeout(self._health_timeout_s):
                ready = await replica.upstream.ready()
                capacity = await replica.upstream.capacity() if ready else None
        except Exception as exc:  # any failure to answer is a failed check
            log.warning(
                "replica_check_failed", replica=replica.name, error=type(exc).__name__, detail=str(exc)
            )
            ready, capacity = False, None
        was_alive = replica.alive
        was_back_in_s = replica.back_in_s
        replica.healthy = ready
        back_in_s = None if ready else _back_in_s(replica.upstream)
        if back_in_s is None and not ready and back_before is not None:
            back_in_s = 0.0  # back since, or failed: overdue, so checked again soon (_next_poll_s)
        replica.back_in_s = back_in_s
        if replica.back_in_s is not None and was_back_in_s is None:
            log.info("replica_restarting", replica=replica.name, back_in_s=round(replica.back_in_s, 2))
        lost = was_back_in_s is not None and replica.back_in_s is None  # back, or its restart failed
        if capacity is not None:
            if replica.capacity is not None and _totals(capacity) != _totals(replica.capacity):
                lost = True  # a smaller replica may no longer hold some waiters
            said = replica.capacity.max_sequence_tokens if replica.capacity is not None else 0
            replica.capacity = capacity
            if capacity.max_sequence_tokens != said:
                self._note_sequence_limits()
        if ready and replica.suspect_since_check is not None and replica.suspect_since_check < check:
            replica.suspect_since_check = None
            log.info("replica_cleared", replica=replica.name)
        first_check = not replica.checked
        replica.checked = True
        if replica.alive != was_alive:
            lost = True
            log.info("replica_health", replica=replica.name, alive=replica.alive)
        elif first_check and not replica.alive:
            # Down from its first check (a --triton spec naming a port nothing answers): without
            # this line nothing ever said so, while every request it was to serve got a 503.
            log.warning("replica_health", replica=replica.name, alive=False)
        return lost

    def _note_sequence_limits(self) -> None:
        limits = [
            r.capacity.max_sequence_tokens
            for r in self.members
            if r.capacity is not None and r.capacity.max_sequence_tokens > 0
        ]
        self.max_sequence_tokens = min(limits, default=0)


def _back_in_s(upstream: Upstream) -> float | None:
    """When a replica that is down serves again, where its upstream restarts it (`Restarts`)."""
    back_in_s: Callable[[], float | None] | None = getattr(upstream, "back_in_s", None)
    return None if back_in_s is None else back_in_s()


def _totals(capacity: Capacity) -> tuple[int, int]:
    return capacity.kv_tokens_total, capacity.max_sequences
