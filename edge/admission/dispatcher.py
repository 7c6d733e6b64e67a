"""The admission queue in front of the GPU replicas, and the router that hands out their room.

Policy
------
* Room. A replica holds a request for its whole life, charged `kv_tokens` (prompt + max_new_tokens,
  rounded up to the replica's KV block size, `Capacity.kv_block_tokens`; `kv_block_tokens` for a
  replica that reports none) and one sequence. The sum of the charges on a
  replica never exceeds its `Capacity.kv_tokens_total`, nor the count its `max_sequences`: a replica
  is never sent more than it can hold, so its engine never has to preempt.
* Reserve. A ticket with may_use_reserve=False (free tiers) never takes the last
  `reserved_paid_fraction` of a replica's KV tokens or sequences; paid traffic always finds that
  share empty of free work.
* Order. Strict priority between tiers (`Ticket.priority`, higher first). Within a tier, deficit
  round robin between users with a quantum of `fair_quantum_kv_tokens` KV tokens, so backlogged users
  get equal KV-token service whatever their demand (see deficit_round_robin.py for why KV tokens).
* No head-of-line blocking across pools. A ticket that finds no room blocks later tickets only on the
  replicas it is waiting for, and only for the pool it waits on: a free request held back by the
  reserve leaves the reserve to the paid requests behind it; a paid request waits ahead of everything
  on its replicas; a retry that excludes a failed replica does not hold back others on that replica.
* Bounded waiting. A new ticket's wait is estimated as its place in line (everything in higher tiers
  plus one DRR round of its own tier, see TieredQueue.position_of_new) divided by the replicas'
  completion rate (service_rate.py; `prior_service_s` before the first completion). `precheck` says
  no when the queue holds `max_queue` tickets ("queue_full") or when the estimate exceeds the tier's
  max_wait_s ("wait_too_long"); Retry-After is the estimate itself. `acquire` gives up after
  max_wait_s in the queue. Both answer "no_replica" when no healthy replica could ever take the
  ticket (all failed their health checks, or excluded as having failed this request already).
* Health. Every `poll_interval_s` each replica's ready() and capacity() are polled (each bounded by
  `health_timeout_s`); failing either takes it out. A replica whose generation failed
  (`Slot.release(failed=True)`) gets no new work until a health check that started after the failure
  passes; requests already waiting for it keep waiting meanwhile.
* Routing. Among replicas with room, the least loaded by KV-cache fraction (router.py).
* Membership. Replicas come and go while the edge runs (`add_upstream`, `remove_upstream`: replica
  discovery calls them). An added replica is health-checked at once and the queue is reconsidered,
  so waiting tickets may land on it. A removed one drains: it takes no new tickets, its in-flight
  generations finish, then its upstream is closed; waiters that only it could hold fail as
  "no_replica".

Knobs beyond the policy: `replica_share` (several edge instances in front of the same replicas: each
fills only this fraction of every replica, 1 / instance count), `poll_interval_s`, `health_timeout_s`,
`clock` (tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from edge.admission import metrics
from edge.admission.replica import Replica
from edge.admission.router import Claims, candidates, pick
from edge.admission.service_rate import ServiceRate
from edge.admission.slot import ReleaseKind, Slot
from edge.admission.ticket import Overloaded, OverloadReason, Ticket
from edge.admission.tiered_queue import TieredQueue
from edge.upstreams.base import Capacity, Upstream

log = structlog.get_logger("floodgate.admission")


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    exclude: frozenset[str]
    enqueued_at: float
    future: asyncio.Future[Slot] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Dispatcher:
    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        reserved_paid_fraction: float,
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
        poll_interval_s: float = 1.0,
        health_timeout_s: float = 2.0,
        fair_quantum_kv_tokens: int = 256,
        kv_block_tokens: int = 1,
        prior_service_s: float = 5.0,
        replica_share: float = 1.0,
    ) -> None:
        if not 0.0 <= reserved_paid_fraction < 1.0:
            raise ValueError("reserved_paid_fraction must be in [0, 1)")
        if max_queue < 1 or kv_block_tokens < 1 or poll_interval_s <= 0:
            raise ValueError("max_queue, kv_block_tokens and poll_interval_s must be positive")
        if not 0.0 < replica_share <= 1.0:
            raise ValueError("replica_share must be in (0, 1]")
        names = [u.name for u in upstreams]
        if len(set(names)) != len(names):
            raise ValueError("upstream names must be unique")
        self._prior_service_s = prior_service_s
        self._replica_share = replica_share
        self._fallback_block_tokens = kv_block_tokens
        self._replicas = [self._new_replica(u) for u in upstreams]
        # Removed replicas whose in-flight generations have not all finished yet.
        self._draining: list[Replica] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._prior = ServiceRate(prior_service_s)
        self._reserve = reserved_paid_fraction
        self._max_queue = max_queue
        self._clock = clock
        self._poll_interval_s = poll_interval_s
        self._health_timeout_s = health_timeout_s
        self._queue: TieredQueue[_Waiter] = TieredQueue(fair_quantum_kv_tokens)
        self._tier_labels: dict[int, str] = {}
        self._checks_started = 0
        self._health_changed = False
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Poll every replica once (so the first request finds their capacity), then keep polling."""
        await self.check_replicas()
        self._poller = asyncio.create_task(self._poll_forever(), name="admission-health-poll")

    async def aclose(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        for replica in self._draining:
            self._close_removed(replica)
        self._draining.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for waiter in list(self._queue):
            self._queue.remove(waiter)
            self._fail(waiter, self._reject("no_replica", self._poll_interval_s))
        self._publish_metrics()

    # -- membership ------------------------------------------------------------------------------

    def upstream_names(self) -> list[str]:
        """The replicas that may take new tickets (draining ones excluded)."""
        return [r.name for r in self._replicas]

    async def add_upstream(self, upstream: Upstream) -> None:
        """Start sending work to a new replica once its first health check (done here) passes."""
        if self._closed:
            raise RuntimeError("the dispatcher is closed")
        if any(r.name == upstream.name for r in self._replicas):
            raise ValueError(f"a replica named {upstream.name!r} is already a member")
        replica = self._new_replica(upstream)
        self._replicas.append(replica)
        log.info("replica_added", replica=replica.name)
        self._checks_started += 1
        await self._check(replica, self._checks_started)
        self._dispatch()

    def remove_upstream(self, name: str) -> None:
        """Drain a replica: no new tickets from now on; its upstream is closed after the last
        in-flight generation on it releases its slot."""
        replica = next((r for r in self._replicas if r.name == name), None)
        if replica is None:
            raise KeyError(name)
        self._replicas.remove(replica)
        with contextlib.suppress(KeyError):  # never published if no dispatch ran since it joined
            metrics.REPLICA_UTILISATION.remove(replica.name)
        log.info("replica_removed", replica=name, in_flight=replica.sequences)
        if replica.sequences == 0:
            self._close_removed(replica)
        else:
            self._draining.append(replica)
        self._health_changed = True  # waiters that only this replica could hold now fail
        self._dispatch()

    def _new_replica(self, upstream: Upstream) -> Replica:
        return Replica(
            upstream,
            ServiceRate(self._prior_service_s),
            self._replica_share,
            fallback_block_tokens=self._fallback_block_tokens,
        )

    def _close_removed(self, replica: Replica) -> None:
        task = asyncio.create_task(self._close_upstream(replica), name=f"close-{replica.name}")
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

    # -- the API the request pipeline calls ------------------------------------------------------

    def precheck(self, ticket: Ticket) -> None:
        """Raise Overloaded now, before the stream opens, when the ticket would not get a slot in time."""
        if self._closed:
            raise self._reject("no_replica", self._poll_interval_s)
        if len(self._queue) >= self._max_queue:
            raise self._reject("queue_full", self._retry_after(ticket))
        if not candidates(
            self._replicas, ticket, ticket.kv_tokens, frozenset(), self._reserve, alive_only=True
        ):
            raise self._reject("no_replica", self._poll_interval_s)
        estimate = self._estimate_wait(ticket)
        if estimate > ticket.max_wait_s:
            raise self._reject("wait_too_long", estimate)

    async def acquire(self, ticket: Ticket, exclude: frozenset[str] = frozenset()) -> Slot:
        """Wait in the queue for room on a replica. Cancelling the caller withdraws the ticket."""
        if self._closed:
            raise self._reject("no_replica", self._poll_interval_s)
        if len(self._queue) >= self._max_queue:
            raise self._reject("queue_full", self._retry_after(ticket))
        if not candidates(self._replicas, ticket, ticket.kv_tokens, exclude, self._reserve, alive_only=True):
            raise self._reject("no_replica", self._poll_interval_s)
        waiter = _Waiter(ticket, exclude, self._clock())
        self._tier_labels.setdefault(ticket.priority, ticket.tier_label)
        self._queue.push(waiter)
        self._dispatch()
        try:
            async with asyncio.timeout(ticket.max_wait_s):
                # Shielded: a timeout or cancellation must not lose a slot granted meanwhile.
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            slot = self._withdraw(waiter)
            if slot is not None:
                return slot
            raise self._reject("wait_too_long", self._retry_after(ticket)) from None
        except BaseException:
            slot = self._withdraw(waiter)
            if slot is not None:
                slot.discard()
            raise

    def estimate_wait_s(self, ticket: Ticket) -> float:
        """The wait precheck() would predict for this ticket now, in seconds."""
        return self._estimate_wait(ticket)

    def queue_depth(self) -> int:
        return len(self._queue)

    def queue_depth_per_replica(self) -> float:
        """Waiting requests per healthy replica: the autoscaling figure (no healthy replica counts as one)."""
        alive = sum(1 for r in self._replicas if r.alive)
        return len(self._queue) / max(alive, 1)

    # -- dispatching -----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand out every slot that is free now, in policy order. Synchronous: no await inside, so
        the queue and the replicas' accounting never change under it."""
        if self._health_changed:
            self._health_changed = False
            self._fail_unplaceable()
        placeable = [r for r in self._replicas if r.placeable]
        claims = Claims()
        for tier in self._queue.tiers():
            tier.begin_pass()
            while (waiter := tier.next_candidate()) is not None:
                ticket = waiter.ticket
                fitting = [r for r in placeable if r.name not in waiter.exclude]
                replica = pick(fitting, ticket, ticket.kv_tokens, self._reserve, claims)
                if replica is not None:
                    tier.commit(waiter)
                    self._grant(waiter, replica)
                    continue
                tier.block(waiter)
                claims.claim(
                    candidates(self._replicas, ticket, ticket.kv_tokens, waiter.exclude, self._reserve),
                    ticket.may_use_reserve,
                )
                # Stop early once nothing left in the queue could be placed: a flood of blocked free
                # users must not cost a walk over all of them on every release.
                if claims.all_closed(placeable, may_use_reserve=True):
                    self._publish_metrics()
                    return
                if claims.all_closed(placeable, may_use_reserve=False) and not tier.reserve_items:
                    break
        self._publish_metrics()

    def _grant(self, waiter: _Waiter, replica: Replica) -> None:
        now = self._clock()
        charge = replica.charge(waiter.ticket.kv_tokens)
        replica.kv_in_use += charge
        replica.sequences += 1
        slot = Slot(replica, waiter.ticket, charge, now, self._release)
        metrics.QUEUE_WAIT.labels(waiter.ticket.tier_label).observe(max(0.0, now - waiter.enqueued_at))
        waiter.future.set_result(slot)

    def _release(self, slot: Slot, kind: ReleaseKind) -> None:
        replica = slot.replica
        replica.kv_in_use -= slot.kv_charge
        replica.sequences -= 1
        if kind == "failed":
            if replica.suspect_since_check is None:
                log.warning("replica_suspect", replica=replica.name, request_id=slot.ticket.request_id)
            replica.suspect_since_check = self._checks_started
        elif kind == "done":
            replica.rate.observe(self._clock() - slot.granted_at)
        if replica.sequences == 0 and replica in self._draining:
            self._draining.remove(replica)
            self._close_removed(replica)
        self._dispatch()

    def _withdraw(self, waiter: _Waiter) -> Slot | None:
        """Take a waiter out of the queue; the slot it was granted meanwhile, if any."""
        if self._queue.remove(waiter):
            waiter.future.cancel()
            self._dispatch()  # it may have been blocking others
            return None
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            return future.result()
        return None

    def _fail_unplaceable(self) -> None:
        """Fail the waiters that no healthy replica could ever take."""
        for waiter in list(self._queue):
            alive = candidates(
                self._replicas,
                waiter.ticket,
                waiter.ticket.kv_tokens,
                waiter.exclude,
                self._reserve,
                alive_only=True,
            )
            if not alive:
                self._queue.remove(waiter)
                self._fail(waiter, self._reject("no_replica", self._poll_interval_s))

    @staticmethod
    def _fail(waiter: _Waiter, error: Overloaded) -> None:
        if not waiter.future.done():
            waiter.future.set_exception(error)

    # -- estimates -------------------------------------------------------------------------------

    def _estimate_wait(self, ticket: Ticket) -> float:
        position = self._queue.position_of_new(ticket)
        if position == 1 and any(
            r.placeable and r.has_room(ticket.kv_tokens, ticket.may_use_reserve, self._reserve)
            for r in self._replicas
        ):
            return 0.0
        return position / self._completions_per_s()

    def _retry_after(self, ticket: Ticket) -> float:
        """When trying again is worth it: the estimated wait, and never less than one completion."""
        return max(self._estimate_wait(ticket), 1.0 / self._completions_per_s())

    def _completions_per_s(self) -> float:
        alive = [r for r in self._replicas if r.alive]
        # No replica alive: assume one at the prior, so the estimate stays finite.
        return sum(r.completions_per_s() for r in alive) or self._prior.completions_per_s(1)

    def _reject(self, reason: OverloadReason, retry_after_s: float) -> Overloaded:
        metrics.REJECTED.labels(reason).inc()
        return Overloaded(reason, retry_after_s)

    # -- health ----------------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval_s)
            await self.check_replicas()

    async def check_replicas(self) -> None:
        """Poll every replica's health and capacity now (start() and the poller call this)."""
        self._checks_started += 1
        check = self._checks_started
        await asyncio.gather(*(self._check(replica, check) for replica in list(self._replicas)))
        self._dispatch()

    async def _check(self, replica: Replica, check: int) -> None:
        try:
            async with asyncio.timeout(self._health_timeout_s):
                ready = await replica.upstream.ready()
                capacity = await replica.upstream.capacity() if ready else None
        except Exception as exc:  # any failure to answer is a failed check
            log.warning("replica_check_failed", replica=replica.name, error=type(exc).__name__)
            ready, capacity = False, None
        was_alive = replica.alive
        replica.healthy = ready
        if capacity is not None:
            if replica.capacity is not None and _totals(capacity) != _totals(replica.capacity):
                self._health_changed = True  # a smaller replica may no longer hold some waiters
            replica.capacity = capacity
        if ready and replica.suspect_since_check is not None and replica.suspect_since_check < check:
            replica.suspect_since_check = None
            log.info("replica_cleared", replica=replica.name)
        if replica.alive != was_alive:
            self._health_changed = True
            log.info("replica_health", replica=replica.name, alive=replica.alive)

    # -- metrics ---------------------------------------------------------------------------------

    def _publish_metrics(self) -> None:
        for priority, depth in self._queue.depth_by_priority().items():
            metrics.QUEUE_DEPTH.labels(self._tier_labels.get(priority, str(priority))).set(depth)
        for replica in self._replicas:
            metrics.REPLICA_UTILISATION.labels(replica.name).set(replica.utilisation())
        metrics.QUEUE_DEPTH_PER_REPLICA.set(self.queue_depth_per_replica())


def _totals(capacity: Capacity) -> tuple[int, int]:
    return capacity.kv_tokens_total, capacity.max_sequences
