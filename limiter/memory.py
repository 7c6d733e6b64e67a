"""The in-memory twin: the same algorithm as the Redis scripts, for one process.

Used by a single edge instance (`make serve`), by the Redis store as its fail-open fallback, and by
the differential test as the reference the scripts must agree with. Run in each of N instances
(`instance_count`), it enforces each tier divided by N, so the instances together never exceed it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from limiter import policy
from limiter.base import Admission, Decision, TierLimits
from limiter.lease import admission
from limiter.reads import ReadBuckets, ReadDecision
from limiter.stream_ends import StreamEnds
from limiter.tiers import per_instance

DEFAULT_BATCH_TOKENS = 32
# Longer than the longest queue wait plus the longest gap between two charges of a live stream.
DEFAULT_LEASE_TTL_S = 300.0
# Idle users are dropped, the twin's stand-in for key expiry: every this many operations, this
# many of the users held are looked at, in turn (as many as the operations, so the users held stay
# within about twice those not idle: a new user costs at least one operation). All of them at once,
# every 10,000 operations, stalled one call (and the edge's loop with it) 0.67 s at 200,000 users.
_SWEEP_EVERY = 1_000
_SWEEP_SLICE = 1_000
# Users (or ledgers) a restore's listing looks at between two turns of the loop (`active_budgets`):
# about a microsecond each, so a millisecond or so at a time.
LOOK_SLICE = 1_000


@dataclass(slots=True)
class _User:
    """One user in the twin: a budget per tier it has been in (TierLimits.name), each in that
    tier's units, and its live leases, one set across tiers (its concurrency). Every budget's
    UserState holds that same dict, so policy's steps on any of them see all the user's streams."""

    leases: dict[str, int] = field(default_factory=dict)
    budgets: dict[str, policy.UserState] = field(default_factory=dict)

    def budget(self, tier: str) -> policy.UserState:
        state = self.budgets.get(tier)
        if state is None:
            state = self.budgets[tier] = policy.UserState(leases=self.leases)
        return state


@dataclass(slots=True)
class _Ledger:
    """What this twin decided on its own for one user's budget in one tier (as the Redis store's
    fail-open fallback) since Redis last took it: a second GCRA state, in the twin's units and
    clock, fed by those decisions alone. The twin's own state holds this instance's whole
    traffic, which a Redis that kept its data already counts but for this part; N instances
    restoring after one outage each add theirs (restore.lua), where the later of the TATs kept
    only one instance's."""

    generation: int  # names this ledger on Redis (restore.lua): a retry of it adds only what is new
    # The instance count it began under, and what the count's changes since did to its TATs: they
    # are `born_tat * count / born_count + offset_us` (set_instance_count rescales a ledger around
    # the moment of each change). restore.lua compares a resent ledger with what it kept of it in
    # those first units, whatever the count became meanwhile.
    born_count: int
    offset_us: float = 0.0
    state: policy.UserState = field(default_factory=policy.UserState)
    changes: int = 0
    # Requests a restore carries that has not answered yet (`ledger` to `ledger_sent`): it may have
    # put their slots back on Redis already, and a settle there refunds them. Counted per restore:
    # two may carry one (an admit's own beside the whole one), and one never sent leaves the other.
    sending: Counter[str] = field(default_factory=Counter)
    # The refunds of those settled meanwhile, kept until their restores end: none sent (`ledger_unsent`),
    # the ledger refunds them then; one that may have run, Redis does (or at worst nobody). Kept
    # with their tier, not its rates: refunded at the rates of the instance count then (the ledger
    # is rescaled when it changes), as its settle's, a fleet shrunk from two edges to one meanwhile
    # refunded twice what the request counted for by then.
    settled_sending: dict[str, tuple[TierLimits, int, bool]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """A ledger as restore.lua takes it: its TATs and the time they were read, in the twin's units
    and clock (the script compares them only with this ledger's earlier ones), the instance count
    that scales them to the tier's, the requests it holds, and how the count's changes rescaled it."""

    generation: int
    request_tat_us: int
    token_tat_us: int
    now_us: int
    instance_count: int
    changes: int
    request_ids: tuple[str, ...]
    born_count: int  # _Ledger's: how its TATs map back to the units it began in
    offset_us: float


def _rescale(state: policy.UserState, now_us: int, new: int, old: int) -> None:
    """The state's leads from intervals `old` times the tier's to `new` times: the same counts."""
    if state.request_tat_us > now_us:
        state.request_tat_us = now_us + (state.request_tat_us - now_us) * new // old
    if state.token_tat_us > now_us:
        state.token_tat_us = now_us + (state.token_tat_us - now_us) * new // old


class MemoryLimiter:
    def __init__(
        self,
        clock: Callable[[], float] | None = None,
        *,
        batch_tokens: int = DEFAULT_BATCH_TOKENS,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        instance_count: int = 1,
    ) -> None:
        self._clock = clock or time.monotonic
        self._instance_count = instance_count
        self.batch_tokens = batch_tokens
        self._lease_ttl_s = lease_ttl_s
        self._lease_ttl_us = round(lease_ttl_s * policy.MICROS)
        self._users: dict[str, _User] = {}
        self._rates: dict[TierLimits, policy.Rates] = {}
        # The steps are synchronous (never awaited mid-way), so asyncio cannot interleave them;
        # the lock makes the twin safe from threads as well.
        self._lock = threading.Lock()
        self._ops = 0
        # The users and ledgers the sweep looks at next, in turn (_sweep).
        self._sweep_users: list[str] = []
        self._sweep_ledgers: list[tuple[str, str]] = []
        self._ends = StreamEnds(self._clock)
        # Only the Redis store's fallback (`own=True`) writes these (_Ledger).
        self._ledgers: dict[tuple[str, str], _Ledger] = {}
        self._generations = itertools.count(1)
        self._reads = ReadBuckets()

    def set_instance_count(self, n: int) -> None:
        """Enforce 1/n of every limit from now on (edge/membership/: the live edge count changed).
        Each tier's rates are derived from n, so the cached ones go, and what each user has spent
        is rescaled to them: a TAT's lead is its count times the twin's interval, n times the
        tier's. Left in the old units, a fleet shrunk from 2 to 1 read a user's 10 of 20 requests
        as 20 (refused, and a restore pushed that onto Redis), and one grown from 1 to 2 as 5.
        A ledger spanning the change (an outage across it) is rescaled alike, and keeps how, so
        that restore.lua compares it with what Redis kept of it in the units it began in."""
        if n < 1:
            raise ValueError("instance_count must be at least 1")
        with self._lock:
            old = self._instance_count
            if n != old:
                now = self._now_us()
                for entry in self._users.values():
                    for state in entry.budgets.values():
                        _rescale(state, now, n, old)
                for ledger in self._ledgers.values():
                    _rescale(ledger.state, now, n, old)
                    ledger.offset_us = ledger.offset_us * n / old + now * (1 - n / old)
                self._reads.rescale(now, n, old)
                self._instance_count = n
                self._rates.clear()

    async def take_read(self, user: str, tier: TierLimits) -> ReadDecision:
        return self.take_read_now(user, tier)

    def take_read_now(self, user: str, tier: TierLimits) -> ReadDecision:
        """One history read of this instance's share of the user's read budget (limiter/reads.py)."""
        with self._lock:
            return self._reads.take(user, tier, self._now_us(), self._instance_count)

    def _now_us(self) -> int:
        return round(self._clock() * policy.MICROS)

    def _rates_for(self, tier: TierLimits) -> policy.Rates:
        rates = self._rates.get(tier)
        if rates is None:
            rates = self._rates[tier] = policy.rates_for(per_instance(tier, self._instance_count))
        return rates

    def _state(self, user: str, tier: str, now_us: int) -> policy.UserState:
        """The user's budget in `tier` (its TATs, and the user's leases)."""
        self._ops += 1
        if self._ops % _SWEEP_EVERY == 0:
            self._sweep(now_us)
        entry = self._users.get(user)
        if entry is None:
            entry = self._users[user] = _User()
        return entry.budget(tier)

    def _sweep(self, now_us: int) -> None:
        """Drop the idle among the next _SWEEP_SLICE users and ledgers (all of them are looked at
        in turn, a fresh list of names once the last went by)."""
        if not self._sweep_users:
            self._sweep_users = list(self._users)
        if not self._sweep_ledgers:
            self._sweep_ledgers = list(self._ledgers)
        users = self._sweep_users[-_SWEEP_SLICE:]
        del self._sweep_users[-_SWEEP_SLICE:]
        for user in users:
            entry = self._users.get(user)
            if entry is None:
                continue
            for idle in [t for t, s in entry.budgets.items() if s.is_idle(now_us)]:
                del entry.budgets[idle]
            if not entry.budgets:  # none is idle while a lease lives: each holds the leases
                del self._users[user]
        # An idle ledger has nothing left to add: a later one starts a new generation.
        keys = self._sweep_ledgers[-_SWEEP_SLICE:]
        del self._sweep_ledgers[-_SWEEP_SLICE:]
        for key in keys:
            ledger = self._ledgers.get(key)
            if ledger is not None and ledger.state.is_idle(now_us):
                del self._ledgers[key]

    def _ledger(self, user: str, tier: str) -> _Ledger:
        ledger = self._ledgers.get((user, tier))
        if ledger is None:
            ledger = self._ledgers[user, tier] = _Ledger(next(self._generations), self._instance_count)
        ledger.changes += 1
        return ledger

    def decide(
        self,
        user: str,
        request_id: str,
        tier: TierLimits,
        input_tokens: int,
        max_output_tokens: int,
        *,
        own: bool = False,
        asked_output_tokens: int | None = None,
    ) -> tuple[Decision, int]:
        """`admit`'s decision and the output tokens it leased, without building a lease. `own`: the
        Redis store's fallback decides alone, so what it admits goes in the user's ledger too."""
        rates = self._rates_for(tier)
        lease_tokens = policy.initial_lease(rates, self.batch_tokens, input_tokens, max_output_tokens)
        charged = self.charged_input(tier, input_tokens)
        with self._lock:
            now = self._now_us()
            state = self._state(user, tier.name, now)
            held = False
            if own:
                policy.prune_expired(state.leases, now)
                held = request_id in state.leases  # admitted before: answered again at no cost
            reply_tokens = policy.reply_to_wait_for(rates, charged, lease_tokens, asked_output_tokens)
            decision = policy.admit(
                state, rates, now, request_id, charged, lease_tokens, self._lease_ttl_us, reply_tokens
            )
            if own and decision.allowed and not held:
                policy.record_admitted(
                    self._ledger(user, tier.name).state,
                    rates,
                    now,
                    request_id,
                    charged + lease_tokens,
                    self._lease_ttl_us,
                )
        return decision, lease_tokens

    def charged_input(self, tier: TierLimits, input_tokens: int) -> int:
        """The prompt tokens an admission here charges: the prompt, or this instance's whole share
        of the tier's tokens where the tier's budget holds the prompt (the edge let it through) and
        the share (the fail-open fallback's, per_instance) does not. No wait would ever admit it
        then, so it is charged the whole share, once the share is untouched, instead of refused for
        good (a Retry-After of hours, then the same answer again). Its lease must hold this, not the
        prompt: a request given back whole is refunded what its lease says it was charged."""
        capacity = self._rates_for(tier).token_capacity
        if capacity < input_tokens <= tier.tokens_per_window:
            return capacity
        return input_tokens

    def own_count_wait(
        self,
        user: str,
        request_id: str,
        tier: TierLimits,
        input_tokens: int,
        max_output_tokens: int,
        *,
        asked_output_tokens: int | None = None,
    ) -> Decision:
        """The decision this instance's own count of the user (the twin's state) makes at the
        tier's whole limits, not its share's: the least a shared store holding that count and the
        other instances' can answer. Its waits bound a fallback refusal's from below (the Redis
        store's `_fallback_admit`). Counts nothing."""
        rates = policy.rates_for(tier)
        lease_tokens = policy.initial_lease(rates, self.batch_tokens, input_tokens, max_output_tokens)
        reply_tokens = policy.reply_to_wait_for(rates, input_tokens, lease_tokens, asked_output_tokens)
        with self._lock:
            now = self._now_us()
            state = self._state(user, tier.name, now)
            # The twin's intervals are instance_count times the tier's (as in `snapshot`).
            n = self._instance_count
            whole = policy.UserState(
                now + max(0, state.request_tat_us - now) // n,
                now + max(0, state.token_tat_us - now) // n,
                dict(state.leases),
            )
        return policy.admit(
            whole, rates, now, request_id, input_tokens, lease_tokens, self._lease_ttl_us, reply_tokens
        )

    async def admit(
        self,
        user: str,
        request_id: str,
        tier: TierLimits,
        input_tokens: int,
        max_output_tokens: int,
        *,
        asked_output_tokens: int | None = None,
    ) -> Admission:
        decision, lease_tokens = self.decide(
            user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens=asked_output_tokens
        )
        return admission(
            self,
            decision,
            user,
            tier,
            request_id,
            input_tokens=self.charged_input(tier, input_tokens),
            granted=lease_tokens,
            max_output_tokens=max_output_tokens,
            batch_tokens=self.batch_tokens,
            slot_ttl_s=self._lease_ttl_s,
            ends=self._ends,
            held_slots=self._rates_for(tier).max_concurrent,
        )

    def charge_now(
        self, user: str, tier: TierLimits, request_id: str, want: int, *, own: bool = False
    ) -> int:
        """`own`: as in `decide`, what the fallback grants alone goes in the user's ledger too."""
        with self._lock:
            now = self._now_us()
            rates = self._rates_for(tier)
            state = self._state(user, tier.name, now)
            granted = policy.charge(state, rates, now, request_id, want, self._lease_ttl_us)
            if own and granted > 0:
                ledger = self._ledger(user, tier.name)
                policy.record_charged(ledger.state, rates, now, request_id, granted, self._lease_ttl_us)
            return granted

    async def charge(self, user: str, tier: TierLimits, request_id: str, want: int) -> int:
        return self.charge_now(user, tier, request_id, want)

    def settle_now(
        self, user: str, tier: TierLimits, request_id: str, refund: int, *, refund_request: bool = False
    ) -> None:
        with self._lock:
            now = self._now_us()
            rates = self._rates_for(tier)
            policy.settle(self._state(user, tier.name, now), rates, now, request_id, refund, refund_request)
            # A request the fallback admitted and no restore has sent yet is refunded in the
            # ledger too: Redis never held its slot, so its settle there refunds nothing. One a
            # restore carries that has not answered is not: that restore may have put its slot
            # back, and Redis refunds it then. Refunded in the ledger as well, it was refunded
            # twice, and the ledger's next admits added nothing on Redis (restore.lua adds only
            # what is past the ledger as last added). Not refunded, it is at worst not refunded.
            ledger = self._ledgers.get((user, tier.name))
            if ledger is not None and request_id in ledger.sending:
                expiry = ledger.state.leases.pop(request_id, None)
                if expiry is not None and expiry > now:
                    # A restore carrying it that turns out never sent leaves its refund to the
                    # ledger: dropped, the next restore put a request settled as never run back on
                    # Redis for good (a review: a third request of three refused, two counted).
                    ledger.settled_sending[request_id] = (tier, refund, refund_request)
            elif ledger is not None and policy.settle(
                ledger.state, rates, now, request_id, refund, refund_request
            ):
                ledger.changes += 1

    async def settle(
        self,
        user: str,
        tier: TierLimits,
        request_id: str,
        refund: int,
        *,
        refund_request: bool = False,
        cancelled: bool = False,
    ) -> bool | None:
        # `cancelled` is for a shared store: one instance's own registry answers a repeated cancel.
        self._ends.ended(user, request_id, ran=not refund_request)
        self.settle_now(user, tier, request_id, refund, refund_request=refund_request)
        return None  # one instance: its cancels never reach a store

    def record_admitted(self, user: str, request_id: str, tier: TierLimits, cost_tokens: int) -> None:
        """Count what the shared store admitted (policy.record_admitted): as the Redis store's
        fallback, this twin mirrors the instance's own traffic, so it takes over from there."""
        with self._lock:
            now = self._now_us()
            policy.record_admitted(
                self._state(user, tier.name, now),
                self._rates_for(tier),
                now,
                request_id,
                cost_tokens,
                self._lease_ttl_us,
            )

    def active_budgets(self, *, ledgers_only: bool = False) -> Iterator[list[tuple[str, str]]]:
        """(user, tier) of each budget whose state still matters (a TAT ahead of now, or a live
        lease, in the twin or in a ledger), in lists, one for each LOOK_SLICE users or ledgers
        looked at: the caller lets the loop run between them. All of them in one step held the loop
        0.16 s at 200,000 users, and every stream on the edge with it. Looked for among the users
        and ledgers held at this call (the Redis store reads its counts at the same moment: what
        comes later is decided on Redis, or counted for another restore), each looked at when its
        slice comes (one gone idle meanwhile has nothing left to put back). `ledgers_only`: the
        ledgers alone, all that a Redis which kept its data lacks of this instance's count."""
        with self._lock:
            users = [] if ledgers_only else list(self._users)
            ledgers = list(self._ledgers)
        return self._active_among(users, ledgers)

    def _active_among(
        self, users: list[str], ledgers: list[tuple[str, str]]
    ) -> Iterator[list[tuple[str, str]]]:
        # The budgets listed that have a ledger: the ledger pass leaves them out. Only those: a set
        # of every budget listed was 200,000 tuples at 200,000 users, freed in one step (26 ms).
        listed: set[tuple[str, str]] = set()
        for start in range(0, len(users), LOOK_SLICE):
            with self._lock:
                now = self._now_us()
                found = [
                    (user, tier)
                    for user in users[start : start + LOOK_SLICE]
                    if (entry := self._users.get(user)) is not None
                    for tier, state in entry.budgets.items()
                    if not state.is_idle(now)
                ]
                listed.update(key for key in found if key in self._ledgers)
            yield found
        for start in range(0, len(ledgers), LOOK_SLICE):
            with self._lock:
                now = self._now_us()
                found = [
                    key
                    for key in ledgers[start : start + LOOK_SLICE]
                    if key not in listed
                    and (ledger := self._ledgers.get(key)) is not None
                    and not ledger.state.is_idle(now)
                ]
            yield found

    def holds(self, user: str, tier: str, *, ledgers_only: bool = False) -> bool:
        """Whether a restore of the user's budget in `tier` has anything to put back: that budget
        ahead of now, a lease of the user's (its slots: one set across tiers, each budget's
        snapshot carries them) or a ledger. `ledgers_only`: for a Redis that kept all but the
        ledgers, a ledger of any of the user's budgets (one admitted alone holds a slot there)."""
        with self._lock:
            now = self._now_us()
            entry = self._users.get(user)
            tiers = {tier} if entry is None else {tier, *entry.budgets}
            if any(
                (ledger := self._ledgers.get((user, name))) is not None and not ledger.state.is_idle(now)
                for name in tiers
            ):
                return True
            if ledgers_only or entry is None:
                return False
            state = entry.budgets.get(tier)
            return bool(entry.leases) or (state is not None and not state.is_idle(now))

    def ledger(self, user: str, tier: str) -> LedgerSnapshot | None:
        """The ledger of the user's budget in `tier` as a restore sends it; None when it holds
        nothing."""
        with self._lock:
            now = self._now_us()
            ledger = self._ledgers.get((user, tier))
            if ledger is None:
                return None
            policy.prune_expired(ledger.state.leases, now)
            if ledger.state.is_idle(now):
                del self._ledgers[user, tier]
                return None
            state = ledger.state
            ledger.sending.update(tuple(state.leases))  # one each (a dict would add its values)
            return LedgerSnapshot(
                ledger.generation,
                state.request_tat_us,
                state.token_tat_us,
                now,
                self._instance_count,
                ledger.changes,
                tuple(state.leases),
                ledger.born_count,
                ledger.offset_us,
            )

    def ledger_sent(self, user: str, tier: str, sent: LedgerSnapshot, *, landed: bool) -> None:
        """A restore carrying `sent` ran (`landed`) or may have run (no answer). Its requests leave
        the ledger either way: Redis may hold their slots now, and their settles refund there.
        Landed, the ledger goes unless it changed meanwhile; else it is sent again, whole, under
        the same generation, and restore.lua adds only what Redis has not had of it."""
        with self._lock:
            ledger = self._ledgers.get((user, tier))
            if ledger is None or ledger.generation != sent.generation:
                return
            for request_id in sent.request_ids:
                ledger.state.leases.pop(request_id, None)
                del ledger.sending[request_id]  # its lease is gone: no settle refunds it here
                ledger.settled_sending.pop(request_id, None)  # Redis may hold it: refunded there
            if landed and ledger.changes == sent.changes:
                del self._ledgers[user, tier]

    def ledger_unsent(self, user: str, tier: str, built: LedgerSnapshot) -> None:
        """A restore carrying `built` never reached Redis: its requests are no longer on their way,
        and a settle of one refunds it in the ledger again. Left marked, each such settle refunded
        it nowhere (Redis never held it), and the next restore put back what it had refunded."""
        with self._lock:
            ledger = self._ledgers.get((user, tier))
            if ledger is not None and ledger.generation == built.generation:
                ledger.sending.subtract(built.request_ids)
                now = self._now_us()
                for request_id in built.request_ids:
                    if ledger.sending[request_id] <= 0:
                        del ledger.sending[request_id]
                        # Settled while this restore waited: Redis never held it, so its refund
                        # is the ledger's, as for a settle after (above).
                        settled = ledger.settled_sending.pop(request_id, None)
                        if settled is not None:
                            rates = self._rates_for(settled[0])
                            policy.refund(ledger.state, rates, now, settled[1], settled[2])
                            ledger.changes += 1

    def snapshot(self, user: str, tier: str) -> policy.Snapshot:
        """The user's budget in `tier` relative to now, in the tier's own units (not this instance's
        share), and the user's running requests: what the Redis store puts back after an outage
        (restore.lua)."""
        with self._lock:
            now = self._now_us()
            snap = policy.snapshot(self._state(user, tier, now), now)
        # The twin's intervals are instance_count times the tier's: scale back to the tier's.
        n = self._instance_count
        return policy.Snapshot(snap.request_ahead_us // n, snap.token_ahead_us // n, snap.request_ids)

    def record_charged(self, user: str, tier: TierLimits, request_id: str, granted: int) -> None:
        with self._lock:
            now = self._now_us()
            policy.record_charged(
                self._state(user, tier.name, now),
                self._rates_for(tier),
                now,
                request_id,
                granted,
                self._lease_ttl_us,
            )

    async def aclose(self) -> None:
        return None
