"""The admission queue in front of the GPU replicas: who gets room on which replica, and when.

Policy
------
* Room. A replica holds a request for its whole life, charged KV tokens (rounded up to the
  replica's KV block size, `Capacity.kv_block_tokens`; `kv_block_tokens` for a replica that reports
  none) and one sequence. The sum of the charges on a replica never exceeds its
  `Capacity.kv_tokens_total`, nor the count its `max_sequences`. The charge: with `real_use` (the
  settings' default) what the request holds so far plus a margin, growing as it streams
  (real_use.py), so a replica runs the streams it really has room for and its engine's preemption
  is the valve when replies run long; without it, the worst case `kv_tokens` (prompt +
  max_new_tokens), so a replica is never sent more than it can hold and never has to preempt.
* Reserve. A ticket with may_use_reserve=False (free tiers) never takes the last
  `reserved_paid_fraction` of a replica's KV tokens or sequences; paid traffic always finds that
  share empty of free work.
* Order. Strict priority between tiers (`Ticket.priority`, higher first). Within a tier, start-time
  fair queueing between users, so backlogged users get equal KV-token service whatever their demand,
  and a user's closed loop is next in line once every other user has had a request since its last
  (see fair_queue.py for why KV tokens, and why not deficit round robin).
* No head-of-line blocking across pools. A ticket that finds no room blocks other users' later
  tickets only on the replicas it is waiting for, and only for the pool it waits on: a free request
  held back by the reserve leaves the reserve to the paid requests behind it; a paid request waits
  ahead of everything on its replicas; a retry that excludes a failed replica does not hold back
  others on that replica. Its own user's later tickets wait behind it, on every replica (the fair
  queue serves a user's requests in order, fair_queue.py's `block`): a user's small request can
  wait for its large one while a replica too small for the large one takes another user's.
* Bounded waiting. `precheck` says no when the queue holds `max_queue` tickets of the ticket's tier
  or above ("queue_full": a lower tier's flood never closes the queue to a higher one, which passes
  it; all tiers together hold at most `max_queue` per tier), unless the ticket's user holds less
  than an equal share of its tier's places (one user's flood does not close the queue to the
  tier's other users: tiered_queue.py's under_fair_share; a tier's part of the queue then holds at
  most twice `max_queue`), or
  when the estimated wait (wait_estimate.py) exceeds the tier's max_wait_s ("wait_too_long");
  Retry-After, as for a full queue, is when a place should free for it (never under the
  estimate: running_ends.py). `acquire` gives up after max_wait_s in the queue. Both answer
  "no_replica" when no healthy replica could ever take the ticket (all failed their health checks,
  or excluded as having failed this request already); both apply the same guards (`_turn_away`).
* Never fits. `check_fits` (asked before the limiter) says no when no replica could ever hold the
  ticket, empty: its tier's part of every replica is smaller than its charge, or leaves its tier no
  sequence; never while a replica's size is unknown (it may be the larger one). A 400 naming the
  limit (edge/errors.py), not a no_replica whose Retry-After a client would obey forever. The
  charge itself is unchanged, and this edge's share of a replica the fleet divides is no part of it
  (past that share is a no_replica: it grows as edges leave); a share nothing changes
  (`share_fixed`: the in-memory limiter's instance_count) is.
* A crash is a wait. A replica that is down while its upstream restarts it (the local engine
  process: `Replica.back_in_s`) counts as one that could take the ticket when it is expected back
  within the ticket's max_wait_s: the ticket waits for it, under the same bound, instead of a 503
  (with one engine, every crash of it was an error for every request that met it, and the
  official SDK's two retries were spent before it served again). Where it is not back in time,
  the no_replica's Retry-After is when it should be.
* Routing. Among replicas with room, the least loaded by KV-cache fraction (router.py).
* Nobody waiting. A ticket that finds the queue empty and a replica with room is placed at once,
  without joining the queue: a pass over a queue holding only it would grant it the same replica
  and leave the queue as empty as it found it, so the policy above is unchanged and the common case
  skips the queue's bookkeeping but for its user's share (`placed_at_once`).
* Replicas. Their health, membership and drain live in the replica set (replica_set.py); after any
  change there the queue is reconsidered here, so waiting tickets may land on a new replica, and
  waiters that no replica could ever hold fail: NeverFits where none could hold them even empty
  (the 400 a new request gets), "no_replica" otherwise.

Knobs beyond the policy: `replica_share` (several edge instances in front of the same replicas: each
fills only this fraction of every replica; `set_replica_shares` follows the fleet, a fraction per
replica, 0 on those the fleet gives other edges ([fleet] members_per_replica); 1 for replicas this
instance alone reaches, its own engines), `share_fixed` (nothing will change that
fraction: the in-memory limiter's static instance_count; a request past it never fits),
`poll_interval_s`, `health_timeout_s`, `clock` (tests).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from edge.admission import metrics
from edge.admission.real_use import RealUse
from edge.admission.replica import Replica
from edge.admission.replica_set import ReplicaSet, ReplicaState
from edge.admission.reply_lengths import ReplyLengths
from edge.admission.router import Claims, candidates, pick
from edge.admission.running_ends import expected_ends_s, place_frees_s
from edge.admission.slot import ReleaseKind, Slot
from edge.admission.ticket import NeverFits, Overloaded, OverloadReason, Ticket
from edge.admission.tiered_queue import TieredQueue
from edge.admission.wait_estimate import MIN_RETRY_S, WaitEstimate
from edge.metric_children import child
from edge.upstreams.base import Upstream

# How often the running requests' ends are worked out again for a refusal's Retry-After (and at
# each grant and release).
ENDS_EVERY_S = 0.25
_NO_FREES: tuple[float, list[float], int] = (-math.inf, [], 0)
# A ticket placed with nobody queued is blocked by no earlier one.
_NO_CLAIMS = Claims()


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
        prior_reply_tokens: int = 256,
        kv_block_tokens: int = 1,
        prior_service_s: float = 5.0,
        replica_share: float = 1.0,
        share_fixed: bool = False,
        prefix_weight: float = 0.0,
        real_use: RealUse | None = None,
        model: str = "",
    ) -> None:
        if not 0.0 <= reserved_paid_fraction < 1.0:
            raise ValueError("reserved_paid_fraction must be in [0, 1)")
        if max_queue < 1 or kv_block_tokens < 1 or poll_interval_s <= 0:
            raise ValueError("max_queue, kv_block_tokens and poll_interval_s must be positive")
        if not 0.0 < replica_share <= 1.0:
            raise ValueError("replica_share must be in (0, 1]")
        self.replicas = ReplicaSet(
            upstreams,
            on_change=self._dispatch,
            poll_interval_s=poll_interval_s,
            health_timeout_s=health_timeout_s,
            prior_service_s=prior_service_s,
            replica_share=replica_share,
            fallback_block_tokens=kv_block_tokens,
            model=model,
        )
        # The part of every replica a ticket that fits nowhere is judged on (check_fits): the whole
        # where the fleet divides them (this edge's share grows as edges leave), this edge's share
        # where nothing ever changes it.
        self._share_fixed = share_fixed
        self._fits_share = replica_share if share_fixed else 1.0
        self._estimate = WaitEstimate(prior_service_s, reserved_paid_fraction)
        self._reserve = reserved_paid_fraction
        # How much a replica's cached prompt prefix weighs against its load (router.py); 0: ignored.
        self._prefix_weight = prefix_weight
        # None: charge every request its worst case (prompt + max_tokens) for its whole life.
        self._real_use = real_use
        self._max_queue = max_queue
        # The served model this queue is for (edge/models/): its metrics, and its requests'
        # (edge/pipeline.py), carry the name.
        self.model = model
        self._clock = clock
        self._poll_interval_s = poll_interval_s
        # Each user's replies' length, what the fair queue counts a request's reply at
        # (prior_reply_tokens for a user not seen yet).
        self._reply_lengths = ReplyLengths(prior_reply_tokens)
        # The slots granted and not released: when they should end tells a refused client when to
        # come back (running_ends.py); worked out at most every ENDS_EVERY_S, for a flood of
        # refusals (0.65 µs a running slot each time).
        self._running: set[Slot] = set()
        self._frees: tuple[float, list[float], int] = _NO_FREES
        self._queue: TieredQueue[_Waiter] = TieredQueue(self._fair_cost)
        # The tiers whose queue depth is exported (one gauge each, tiers of a priority apart).
        self._tier_labels: set[str] = set()
        # Tickets refused so far, for any reason: demand no replica served.
        self._turned_away = 0
        # Requests that asked for a replica (precheck) and their prompt tokens: the work signal
        # (edge/scaling/demand.py) prices them, served or refused.
        self._offered_requests = 0
        self._offered_prompt_tokens = 0
        # The gauges read the queue when Prometheus collects (edge/admission/metrics.py).
        metrics.watch_queue(model, self.queue_depth_per_replica)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Poll every replica once (so the first request finds their capacity), then keep polling."""
        await self.replicas.start()

    async def aclose(self) -> None:
        await self.replicas.aclose()
        for waiter in list(self._queue):
            self._queue.remove(waiter)
            self._fail(waiter, self._reject("no_replica", self._poll_interval_s))

    # -- membership (the replica set's, here for replica discovery) ------------------------------

    def upstream_names(self) -> list[str]:
        """The replicas that may take new tickets (draining ones excluded)."""
        return self.replicas.names()

    async def add_upstream(self, upstream: Upstream) -> None:
        """Start sending work to a new replica once its first health check (done here) passes."""
        await self.replicas.add(upstream)

    def remove_upstream(self, name: str) -> None:
        """Drain a replica: no new tickets; its upstream is closed once its last generation ends."""
        self.replicas.remove(name)

    def set_replica_shares(self, share_of: Callable[[str], float]) -> None:
        """Fill `share_of(name)` (0..1) of each replica from now on, a replica discovered later
        included, and reconsider the queue: the fleet changed (edge/membership/). 0 takes no new
        work there (this edge joins or drains, or is not among the replica's members)."""
        if self._share_fixed:
            raise RuntimeError("this dispatcher's replica share is fixed (share_fixed)")
        self.replicas.set_shares(share_of)

    async def check_replicas(self) -> None:
        """Poll every replica's health and capacity now (the poller does it every poll_interval_s)."""
        await self.replicas.check_all()

    def replica_states(self) -> list[ReplicaState]:
        """Every replica as last polled, without waiting on any (readiness, /metrics)."""
        return self.replicas.states()

    # -- the API the request pipeline calls ------------------------------------------------------

    @property
    def max_sequence_tokens(self) -> int:
        """The smallest prompt + reply any replica reports holding (0: none reports one)."""
        return self.replicas.max_sequence_tokens

    def check_fits(self, ticket: Ticket) -> None:
        """Raise NeverFits when no replica of a known size could ever hold the ticket, empty and
        whatever the wait: its tier's part of every replica is too small for what it is charged
        (`_charge`), or the paid reserve leaves its tier no sequence. The queue would turn it away
        no_replica, a 503 saying when to come back, and a client that came back as told was
        refused the same way forever beside an idle replica. Judged on the replicas' sizes alone,
        never on what they hold now, nor on this edge's share of them where the fleet divides them
        (it grows as edges leave), but on that share where it is fixed (`share_fixed`: the
        in-memory limiter's static instance_count, which nothing changes: a 503 past it was
        obeyed forever too) (Replica.largest), and only
        once every replica has said its size: one that has not (loading its engine, down since
        before this edge started) may be the larger one, and a 400 would have the client shorten
        for good a request it serves as soon as it is up."""
        members = self.replicas.members
        if not members:
            return
        kv_tokens = self._charge(ticket)
        # Every request asks, so it stops at the first replica that would do (each one's limits
        # worked out once per size it reports: Replica.largest).
        most = -1  # the largest part of a replica that runs a sequence of the ticket's kind
        share = self._fits_share
        for replica in members:
            if not replica.size_known:
                return
            kv, sequences = replica.largest(ticket.may_use_reserve, self._reserve, share)
            if sequences >= 1:
                if kv_tokens <= kv:
                    return
                most = max(most, kv)
        raise NeverFits(
            kv_tokens, max(most, 0), most >= 0, ticket.may_use_reserve, share < 1.0, ticket.prompt_tokens
        )

    def precheck(self, ticket: Ticket) -> None:
        """Raise Overloaded now, before the stream opens, when the ticket would not get a slot in
        time. Counts the ticket as offered (the scaling signal's demand), refused or not, but for
        a client's retry (`Ticket.retry`) refused again: the work it asks for was counted when it
        was first asked for, and with no replica up (minutes, while a first host boots) every
        client's every try is refused, so each counted once per try. A retry taken is counted:
        its earlier try may have been refused before the queue (the limiter) and never counted,
        and one whose earlier try the queue refused is counted twice at most."""
        refusal = self._precheck_refusal(ticket)
        if refusal is None or not ticket.retry:
            self._offered_requests += 1
            self._offered_prompt_tokens += (
                ticket.kv_tokens if ticket.prompt_tokens is None else ticket.prompt_tokens
            )
        if refusal is not None:
            raise refusal

    def _precheck_refusal(self, ticket: Ticket) -> Overloaded | None:
        if not self._queue and not self.replicas.closed and self._room_now(ticket):
            # First in line with room now: no guard could refuse it and its estimated wait is 0.
            return None
        refusal = self._turn_away(ticket, frozenset())
        if refusal is None and self._wait_s(ticket) > ticket.max_wait_s:
            # Judged by the estimate, told when to come back as a full queue is: the estimate alone
            # ignored the running replies, and said 1.3 s while the only place stayed busy 7 s.
            return self._reject("wait_too_long", self._retry_after(ticket))
        return refusal

    async def acquire(self, ticket: Ticket, exclude: frozenset[str] = frozenset()) -> Slot:
        """Wait in the queue for room on a replica. Cancelling the caller withdraws the ticket.
        Raises Overloaded, or NeverFits where the replicas changed while it waited so that none
        could ever hold it (`_fail_unplaceable`)."""
        if not self._queue and not self.replicas.closed:
            slot = self._place_at_once(ticket, exclude)
            if slot is not None:
                return slot
        refusal = self._turn_away(ticket, exclude)
        if refusal is not None:
            raise refusal
        waiter = _Waiter(ticket, exclude, self._clock())
        if ticket.tier_label not in self._tier_labels:
            self._watch_tier(ticket.priority, ticket.tier_label)
        self._queue.push(waiter)
        self._dispatch()
        if waiter.future.done():
            return waiter.future.result()  # placed (or failed) at once: no wait to bound or shield
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

    def typical_reply_tokens(self, user: str, max_new_tokens: int) -> int:
        """The reply this user's requests usually get (reply_lengths.py), at most max_new_tokens."""
        return self._reply_lengths.estimate(user, max_new_tokens)

    def estimate_wait_s(self, ticket: Ticket) -> float:
        """The wait precheck() would predict for this ticket now, in seconds."""
        return self._wait_s(ticket)

    def queue_depth(self) -> int:
        return len(self._queue)

    def turned_away(self) -> int:
        """Tickets refused since start (every Overloaded raised)."""
        return self._turned_away

    def offered(self) -> tuple[int, int]:
        """(requests, their prompt tokens) that asked for a replica since start, served or refused."""
        return self._offered_requests, self._offered_prompt_tokens

    def queue_depth_per_replica(self) -> float:
        """Waiting requests per healthy replica: the autoscaling figure (no healthy replica counts as one)."""
        return len(self._queue) / max(len(self.replicas.alive()), 1)

    # -- guards ----------------------------------------------------------------------------------

    def _turn_away(self, ticket: Ticket, exclude: frozenset[str]) -> Overloaded | None:
        """Why a ticket may not even join the queue now (None: it may)."""
        if self.replicas.closed:
            return self._reject("no_replica", self._poll_interval_s)
        if self._queue.depth_from(ticket.priority) >= self._max_queue and not self._queue.under_fair_share(
            ticket, self._max_queue
        ):
            return self._reject("queue_full", self._retry_after(ticket))
        if not self._candidates_within(ticket, exclude, ticket.max_wait_s):
            return self._no_replica(ticket, exclude)
        return None

    def _candidates_within(self, ticket: Ticket, exclude: frozenset[str], wait_s: float) -> list[Replica]:
        """The replicas the ticket may wait for: alive, or restarting and back within `wait_s`."""
        members = self.replicas.members
        return candidates(members, ticket, self._charge(ticket), exclude, self._reserve, within_s=wait_s)

    def _no_replica(self, ticket: Ticket, exclude: frozenset[str]) -> Overloaded:
        """No replica the ticket may wait for. Retry-After: when the first one being restarted
        should serve again (the replica set checks it then: replica_set.py), never under
        MIN_RETRY_S; with none restarting, the next health poll."""
        coming = self._candidates_within(ticket, exclude, math.inf)
        backs = [r.back_in_s for r in coming if r.back_in_s is not None]
        retry_after_s = max(min(backs), MIN_RETRY_S) if backs else self._poll_interval_s
        return self._reject("no_replica", retry_after_s)

    def _reject(self, reason: OverloadReason, retry_after_s: float) -> Overloaded:
        child(metrics.REJECTED, self.model, reason).inc()
        self._turned_away += 1
        return Overloaded(reason, retry_after_s)

    # -- dispatching -----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand out every slot that is free now, in policy order. Synchronous: no await inside, so
        the queue and the replicas' accounting never change under it."""
        if self.replicas.take_lost_room():
            self._fail_unplaceable()
        if not self._queue:
            return  # every release of a slot lands here; most find nobody waiting
        members = self.replicas.members
        placeable = [r for r in members if r.placeable]
        claims = Claims()
        for tier in self._queue.tiers():
            tier.begin_pass()
            while (waiter := tier.next_candidate()) is not None:
                ticket = waiter.ticket
                fitting = [r for r in placeable if r.name not in waiter.exclude]
                kv_tokens = self._charge(ticket)
                replica = pick(fitting, ticket, kv_tokens, self._reserve, claims, self._prefix_weight)
                if replica is not None:
                    tier.commit(waiter)
                    self._grant(waiter, replica)
                    continue
                tier.block(waiter)
                claims.claim(
                    candidates(members, ticket, kv_tokens, waiter.exclude, self._reserve),
                    ticket.may_use_reserve,
                )
                # Stop early once nothing left in the queue could be placed: a flood of blocked free
                # users must not cost a walk over all of them on every release.
                if claims.all_closed(placeable, may_use_reserve=True):
                    return
                if claims.all_closed(placeable, may_use_reserve=False) and not tier.reserve_items:
                    break

    def _place_at_once(self, ticket: Ticket, exclude: frozenset[str]) -> Slot | None:
        """With nobody queued: the slot the dispatch pass would grant this ticket alone, or None
        (no room now: it joins the queue). `_dispatch` first settles a lost-room mark, which with an
        empty queue fails nobody, so here it is only cleared."""
        self.replicas.take_lost_room()
        fitting = [r for r in self.replicas.members if r.placeable and r.name not in exclude]
        replica = pick(fitting, ticket, self._charge(ticket), self._reserve, _NO_CLAIMS, self._prefix_weight)
        if replica is None:
            return None
        if ticket.tier_label not in self._tier_labels:
            self._watch_tier(ticket.priority, ticket.tier_label)
        self._queue.placed_at_once(ticket)
        now = self._clock()
        return self._grant_slot(ticket, replica, now, now)

    def _charge(self, ticket: Ticket) -> int:
        """The KV tokens the ticket is charged when placed: what every judgment of room (placement,
        room now, the wait estimate, whether a replica could ever take it) asks for. Judged by the
        worst case while placement charged real use, a request the replicas had room for was
        refused (429 wait_too_long, or 503 no_replica for good where the worst case passed this
        edge's share of a replica)."""
        return self._real_use.tokens(ticket) if self._real_use else ticket.kv_tokens

    def _fair_cost(self, ticket: Ticket) -> int:
        """What a ticket costs its user in the fair queue: its prompt and its reply at the user's own
        average length (reply_lengths.py); its worst case where the prompt's length is not known."""
        if ticket.prompt_tokens is None or ticket.max_new_tokens is None:
            return ticket.kv_tokens
        return ticket.prompt_tokens + self._reply_lengths.estimate(ticket.user, ticket.max_new_tokens)

    def _room_now(self, ticket: Ticket) -> bool:
        """A replica could take the ticket now (what the wait estimate of the first in line asks)."""
        kv_tokens = self._charge(ticket)
        return any(
            r.placeable and r.has_room(kv_tokens, ticket.may_use_reserve, self._reserve)
            for r in self.replicas.members
        )

    def _grant(self, waiter: _Waiter, replica: Replica) -> None:
        waiter.future.set_result(self._grant_slot(waiter.ticket, replica, waiter.enqueued_at, self._clock()))

    def _grant_slot(self, ticket: Ticket, replica: Replica, enqueued_at: float, now: float) -> Slot:
        charge = replica.charge(self._charge(ticket))
        replica.add_kv(charge, ticket.may_use_reserve)
        replica.sequences += 1
        replica.sent_prefix(ticket.prefix_keys)
        child(metrics.QUEUE_WAIT, self.model, ticket.tier_label).observe(max(0.0, now - enqueued_at))
        slot = Slot(replica, ticket, charge, now, self._release, self._clock, self._real_use)
        self._running.add(slot)
        self._frees = _NO_FREES
        return slot

    def _release(self, slot: Slot, kind: ReleaseKind) -> None:
        replica = slot.replica
        replica.add_kv(-slot.kv_charge, slot.ticket.may_use_reserve)
        replica.sequences -= 1
        self._running.discard(slot)
        # A replica's failure before the first token costs the user no turn: its retry starts where
        # the failed try did. One after it ran (failed mid-reply, never retried) was service. A slot
        # withdrawn (its request gone as it was granted) ran nothing at all.
        served = kind != "withdrawn" and (kind != "failed" or slot.first_token_at is not None)
        self._queue.released(slot.ticket, served=served)
        self._frees = _NO_FREES
        max_new = slot.ticket.max_new_tokens
        if kind == "finished" and max_new is not None:
            self._reply_lengths.observe(slot.ticket.user, slot.generated, max_new)
        elif kind == "cut" and max_new is not None:
            self._reply_lengths.observe_at_least(slot.ticket.user, slot.generated, max_new)
        if kind in ("finished", "cut") and max_new is not None:
            self._queue.repriced(slot.ticket.user)
        # A cut reply freed its place when it was cut: a departure like any other for the rate at
        # which places free (Little's law counts every one), whatever its reply would have run to.
        held_s = self._clock() - slot.granted_at if kind in ("finished", "cut") else None
        self.replicas.released(
            replica, failed=kind == "failed", held_s=held_s, request_id=slot.ticket.request_id
        )
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
        """Fail the waiters that no healthy replica could ever take: NeverFits (a 400 naming the
        limit) where no replica could hold one even empty, as `check_fits` refuses it on arrival;
        no_replica for the others. A waiter that a change of size or membership left past every
        replica failed 503, and only its retry was told why (after as many retries as the client
        makes on a 503)."""
        for waiter in list(self._queue):
            if not self._candidates_within(waiter.ticket, waiter.exclude, waiter.ticket.max_wait_s):
                self._queue.remove(waiter)
                try:
                    self.check_fits(waiter.ticket)
                except NeverFits as never:
                    self._fail(waiter, never)
                    continue
                self._fail(waiter, self._no_replica(waiter.ticket, waiter.exclude))

    @staticmethod
    def _fail(waiter: _Waiter, error: Overloaded | NeverFits) -> None:
        if not waiter.future.done():
            waiter.future.set_exception(error)

    # -- estimates and metrics -------------------------------------------------------------------

    def _wait_s(self, ticket: Ticket) -> float:
        position = self._queue.position_of_new(ticket)
        first = self._queue.first_in_line(ticket)
        return self._estimate.wait_s(position, ticket, self._charge(ticket), self.replicas.members, first)

    def _retry_after(self, ticket: Ticket) -> float:
        position = self._queue.position_of_new(ticket)
        first = self._queue.first_in_line(ticket)
        frees, age_s = self._place_frees(position)
        return self._estimate.retry_after_s(
            position, ticket, self._charge(ticket), self.replicas.members, first, frees, age_s
        )

    def _place_frees(self, places: int) -> tuple[list[float], float]:
        """When the next `places` places should free (running_ends.py), as worked out at most
        ENDS_EVERY_S ago (and since the last grant or release), and how long ago."""
        now = self._clock()
        at, frees, upto = self._frees
        if now - at < ENDS_EVERY_S and places <= upto:
            return frees, now - at
        alive = [r for r in self.replicas.members if r.alive]
        members = {id(r) for r in alive}
        service_s = sum(r.rate.service_s for r in alive) / len(alive) if alive else 0.0
        ends = expected_ends_s(
            (s for s in self._running if id(s.replica) in members), now, self._reply_lengths, service_s
        )
        frees = place_frees_s(ends, places, service_s)
        self._frees = (now, frees, places)
        return frees, 0.0

    def _watch_tier(self, priority: int, label: str) -> None:
        self._tier_labels.add(label)
        metrics.watch_tier(self.model, label, lambda: self._queue.depth_of(priority, label))
