"""The output lease both stores hand out: local arithmetic until the reserved tokens run out."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from typing import Protocol

from limiter.base import Admission, Decision, StoreUnavailable, TierLimits
from limiter.stream_ends import StreamEnds, with_concurrency_wait

# How far a lease's batch may grow (`Lease`): a 2,000-token reply streamed fast enough then costs
# 6 store calls after its admission instead of 62 (9 at 30 tokens a second).
MAX_BATCH_TOKENS = 512


class LeaseStore(Protocol):
    """The two store calls a lease needs after admission."""

    async def charge(self, user: str, tier: TierLimits, request_id: str, want: int) -> int:
        """Reserve up to `want` more output tokens; returns how many the budget granted. Raises
        StoreUnavailable where the store cannot answer and the tier fails closed."""
        ...

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
        """Free the request's slot and refund `refund` tokens, and the request itself when
        `refund_request` (idempotent in the store); `cancelled`: a cancel ended it here, which a
        shared store records (OutputLease.settle). True when the store's record of the request
        says the fleet's cancel came first (OutputLease.settle); None when nothing says."""
        ...


class Lease:
    """Output tokens reserved for one running generation.

    `take(n)` is pure local arithmetic while the reservation lasts; once it is used up, one store
    call extends it by a batch (never past the request's max_output_tokens), so a stream of T
    tokens costs about T / batch store calls, not T.

    The batch doubles with each extension, up to MAX_BATCH_TOKENS, while the stream keeps pace:
    each charge is a store round trip on the edge (about 60 µs of its CPU on Redis) and a script on
    the store. At a fixed batch of 32, 200 streams on Redis cost the edge 1.09-1.11x its CPU per
    token against the in-process store, and charges were about 60 % of Redis's own CPU per token;
    growing, 0.88-0.90x the edge's CPU per token and 0.38-0.41x Redis's (docs/bench-streams.md,
    nineteenth pass). What it costs: a lease holds at most one batch ahead of its use, and a batch
    is never more than what the stream has already used plus the first, so a long stream
    reserves at most about as many tokens ahead as it has streamed (refunded at settle). A user
    whose budget is nearly spent sees it spent sooner by its running streams' reservations, as
    OpenAI's limits count a request's max_tokens up front.

    Every charge also refreshes the request's concurrency slot, which frees when not refreshed for
    its TTL (as an edge that died would leave it), so a batch must never outlast the TTL, however
    the stream's pace changes: the batch doubles only when the one just used lasted under a 64th
    of the TTL (under 4.7 s of the default 300; at the same pace the next comes within a 32nd, so
    the stream would have to slow 32-fold within one batch for its slot to lapse), and halves, down
    to the first batch's size, when it lasted over a 16th (a stream slowing down shrinks its
    batches as it goes). At 30 tokens a second a batch stops growing at 256 tokens.
    """

    def __init__(
        self,
        store: LeaseStore,
        user: str,
        tier: TierLimits,
        request_id: str,
        *,
        input_tokens: int,
        granted: int,
        max_output_tokens: int,
        batch_tokens: int,
        slot_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._user = user
        self._tier = tier
        self._request_id = request_id
        self._input_tokens = input_tokens
        self._granted = granted
        self._used = 0
        self._max_output = max_output_tokens
        self._batch = batch_tokens
        self._first_batch = batch_tokens
        self._max_batch = max(batch_tokens, MAX_BATCH_TOKENS)
        self._grow_within_s = slot_ttl_s / 64
        self._shrink_after_s = slot_ttl_s / 16
        self._spent = False  # `take` answered short: the generation stops, no store call helps
        self._settled = False
        self._ran = False  # settled as run: what it used stays charged, the rest refunded
        # An extension sent to the store whose grant is not counted yet: `take` was cancelled while
        # it waited (a cancel, a disconnect), and `settle` counts it before refunding.
        self._extending: asyncio.Future[int] | None = None
        self._clock = clock
        self._extended_at = clock()
        # When the stream's first token was charged: its rate since then tells when it will end
        # (limiter/stream_ends.py).
        self.first_token_at: float | None = None

    @property
    def granted(self) -> int:
        return self._granted

    @property
    def charged(self) -> int:
        if self._ran:
            return self._input_tokens + self._used  # the unused rest was refunded
        return self._input_tokens + self._granted

    @property
    def used(self) -> int:
        return self._used

    @property
    def max_output(self) -> int:
        return self._max_output

    def try_take(self, n: int) -> int | None:
        """`take` without a coroutine while the reservation covers n (the per-token case); None
        when only `take` can answer, because the store must extend the lease."""
        held = self._granted - self._used
        if n > held and not self._spent and not self._settled:
            return None
        if self._settled or n <= 0:
            return 0
        covered = n if n <= held else held
        if self._used == 0 and covered:
            self.first_token_at = self._clock()
        self._used += covered
        return covered

    def give_back(self, n: int) -> None:
        self._used -= min(n, self._used)

    async def take(self, n: int) -> int:
        taken = self.try_take(n)
        if taken is not None:
            return taken
        now = self._clock()
        # The first batch's time includes the wait for the stream's first token.
        lasted = now - self._extended_at
        if lasted < self._grow_within_s:
            self._batch = min(2 * self._batch, self._max_batch)
        elif lasted > self._shrink_after_s:
            self._batch = max(self._batch // 2, self._first_batch)
        self._extended_at = now
        want = min(max(self._batch, n - (self._granted - self._used)), self._max_output - self._granted)
        if want > 0:
            # Shielded: once sent, the store grants the extension whether or not this stream is
            # still there to read the answer; a cancel here leaves it to `settle`, which counts it
            # and refunds what was not used. Cut off, its tokens stayed charged, never refunded.
            self._extending = asyncio.ensure_future(
                self._store.charge(self._user, self._tier, self._request_id, want)
            )
            try:
                got = await asyncio.shield(self._extending)
            except StoreUnavailable:
                self._extending = None  # it granted nothing: the refund has nothing to count
                raise
            self._extending = None
        else:
            got = 0
        self._granted += got
        taken = self._take_held(n)
        # Spent once this answer falls short of n (the generation stops now), not at a short grant:
        # that says what the budget held at that instant, and by the time the grant is used it may
        # hold more (the user's other streams settled and refunded their leases, or it refilled).
        # Taken for the budget's end, it stopped the stream with the marker, the budget not spent
        # (one more store call per stream the budget stops: the one that answers short).
        self._spent = taken < n
        return taken

    def _take_held(self, n: int) -> int:
        if self._settled or n <= 0:
            return 0
        covered = min(n, self._granted - self._used)
        if self._used == 0 and covered:
            self.first_token_at = self._clock()
        self._used += covered
        return covered

    async def settle(self, *, ran: bool = True, cancelled: bool = False) -> bool | None:
        if self._settled:
            return None
        self._settled = True
        extending, self._extending = self._extending, None
        if extending is not None:
            # A store that failed the call granted nothing the refund could count.
            with contextlib.suppress(Exception):
                self._granted += await asyncio.shield(extending)
        if ran:
            self._ran = True
            unused = self._granted - self._used
            return await self._store.settle(
                self._user, self._tier, self._request_id, unused, cancelled=cancelled
            )
        return await self._store.settle(
            self._user,
            self._tier,
            self._request_id,
            self._input_tokens + self._granted,
            refund_request=True,
            cancelled=cancelled,
        )


def admission(
    store: LeaseStore,
    decision: Decision,
    user: str,
    tier: TierLimits,
    request_id: str,
    *,
    input_tokens: int,
    granted: int,
    max_output_tokens: int,
    batch_tokens: int,
    slot_ttl_s: float,
    ends: StreamEnds,
    held_slots: int,
) -> Admission:
    """A store's answer to admit: the decision, with the lease it reserved when allowed. A
    concurrency denial's wait is lowered to when one of the user's streams should end; an
    admitted stream is counted among the user's running ones until it settles. `held_slots`: how
    many slots a concurrency denial means the user holds (the limit the store enforces)."""
    if not decision.allowed:
        if decision.limit == "concurrency":
            estimate_ms = math.ceil(ends.wait_s(user, held_slots) * 1000)
            decision = with_concurrency_wait(decision, estimate_ms)
        return Admission(decision, None)
    lease = Lease(
        store,
        user,
        tier,
        request_id,
        input_tokens=input_tokens,
        granted=granted,
        max_output_tokens=max_output_tokens,
        batch_tokens=batch_tokens,
        slot_ttl_s=slot_ttl_s,
        clock=ends.clock,
    )
    ends.started(user, request_id, lease)
    return Admission(decision, lease)
