"""When will one of a user's running streams end? The real wait behind a concurrency 429.

The store alone cannot tell: a concurrency slot's only time is its lease expiry, refreshed by
every charge, so it says when a *dead* holder's slot frees (minutes), not when a live stream ends.
Until issue 13 the denial therefore carried a fixed 1 s hint, which sent a client polling every
second through a minute-long generation. What this instance does know, without a store call:

- its own running streams: each lease counts the tokens it has streamed since its first token and
  knows its max_output_tokens, so it ends at the latest after (max - used) / its own measured
  rate. A stream's own rate, not a replica-wide one: it already reflects its replica's batch and
  load, and the limiter needs nothing from the edge to know it. Most replies end on their own long
  before that (a client naming no max_tokens gets the tier's largest: two minutes for a reply of
  seconds, past the 60 s the OpenAI SDK heeds), so once this user's own streams have been seen to
  end here, their typical life bounds it as below (the user's own: one instance-wide average let
  other users' short replies cut a long writer's wait to a burst of refused retries);
- how long streams last here (an EWMA of admission-to-settle times D, with a prior until the first
  ends), for the streams nothing is measured of. One of its own with no token yet (queued behind
  other work, in prefill) was admitted a known time ago: it should end D after its admission, or,
  once it has outlived half of D (a queue holding it longer than usual), after as long again as it
  has lived, so that a client following the answer retries a few times as the wait doubles, not
  every few ms. Streams held by another edge instance, which this one knows nothing of, are at
  unknown points of their lives: k of them end, the first, after about D / (k + 1) (the expected
  minimum of k uniform phases). Until the first of these rules, local queued streams were taken
  as at unknown points too: two just admitted behind 4 s of other work were said to free a slot in
  1.7 s (5 s / 3), and a client retrying then was refused three times (a helper's live run).

The wait is the soonest of those ends, and at least MIN_WAIT_S (a stream at its max_tokens that
has not settled yet is expected to end now: retries in a burst of ms would each be refused). It
is an estimate (a stream may stop early on EOS or a cancel, which can only make the true wait
shorter), so the store's answer stays its upper bound (a slot's lease expiry frees it whatever
happens) and HTTP's whole seconds round it up to >= 1 s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from limiter.base import Decision, LimitName

# Before the first stream has ended here: a chat completion of a few hundred tokens at a few
# dozen tokens/s. Forgotten after the first few completions (warm-start average).
PRIOR_STREAM_S = 5.0
_ALPHA = 0.2
# The shortest wait a concurrency denial names: what a slot takes to be settled after its stream ends.
MIN_WAIT_S = 0.25
# Users whose own typical life is kept (the least recently ended forgotten first): ~150 bytes each.
MAX_USERS_KEPT = 20_000


class Progress(Protocol):
    """What a lease reports about its stream (limiter/lease.py keeps it)."""

    @property
    def first_token_at(self) -> float | None: ...

    @property
    def used(self) -> int: ...

    @property
    def max_output(self) -> int: ...


@dataclass(slots=True)
class _Life:
    """How long streams last: an EWMA that starts as a plain average (warm start)."""

    typical_s: float
    samples: int = 0

    def observe(self, lifetime_s: float) -> None:
        self.samples += 1
        self.typical_s += max(_ALPHA, 1.0 / self.samples) * (lifetime_s - self.typical_s)


@dataclass(slots=True)
class _Stream:
    admitted_at: float
    progress: Progress


class StreamEnds:
    def __init__(self, clock: Callable[[], float], prior_s: float = PRIOR_STREAM_S) -> None:
        self.clock = clock
        self._all = _Life(prior_s)
        # Each user's own, for the users seen last (a user's replies are alike more than anyone's).
        self._by_user: OrderedDict[str, _Life] = OrderedDict()
        self._live: dict[str, dict[str, _Stream]] = {}

    def started(self, user: str, request_id: str, progress: Progress) -> None:
        self._live.setdefault(user, {})[request_id] = _Stream(self.clock(), progress)

    def ended(self, user: str, request_id: str, *, ran: bool) -> None:
        streams = self._live.get(user)
        stream = streams.pop(request_id, None) if streams is not None else None
        if streams is not None and not streams:
            del self._live[user]
        if stream is None or not ran:
            return
        lifetime_s = self.clock() - stream.admitted_at
        if lifetime_s <= 0:
            return
        self._all.observe(lifetime_s)
        own = self._by_user.pop(user, None) or _Life(lifetime_s)
        own.observe(lifetime_s)
        self._by_user[user] = own
        if len(self._by_user) > MAX_USERS_KEPT:
            self._by_user.popitem(last=False)

    @property
    def typical_s(self) -> float:
        return self._all.typical_s

    def wait_s(self, user: str, held_slots: int) -> float:
        """The expected time until the user may start a stream again: one of the `held_slots` (its
        limit) running streams ended, or as many as it runs here beyond the limit (a key moved to a
        tier with fewer streams: told when its first stream ends, a client retried and was turned
        away again, each of its streams over the limit a refusal more)."""
        now = self.clock()
        local = self._live.get(user, {})
        typical_s = self._all.typical_s
        own = self._by_user.get(user)
        ends: list[float] = []
        unknown = max(0, held_slots - len(local))  # streams held by other edge instances
        for stream in local.values():
            p = stream.progress
            age = now - stream.admitted_at
            if p.first_token_at is None or p.used <= 0 or now <= p.first_token_at:
                # Not streaming yet: a typical life from its admission, or as long again as it has
                # waited once that is past half of it.
                ends.append(max(typical_s - age, age))
                continue
            rate = p.used / (now - p.first_token_at)
            at_max = max(0, p.max_output - p.used) / rate
            ends.append(at_max if own is None else min(at_max, max(own.typical_s - age, age)))
        if unknown:
            ends.append(typical_s / (unknown + 1))
        if not ends:
            return max(typical_s, MIN_WAIT_S)
        ends.sort()
        over = max(0, len(local) - held_slots)  # that many must end first
        return max(ends[min(over, len(ends) - 1)], MIN_WAIT_S)


def with_concurrency_wait(decision: Decision, estimate_ms: int) -> Decision:
    """A concurrency denial's wait lowered to `estimate_ms` (never above the store's bound, never
    below 1 ms), and the binding limit picked again: with the concurrency wait shorter, the
    request or token limit may now be the longer wait. Ties go to the first in the store's order
    (requests, tokens, concurrency), as the scripts do."""
    if decision.limit != "concurrency":
        return decision
    concurrency_ms = max(1, min(decision.retry_after_ms, estimate_ms))
    waits: list[tuple[LimitName, int]] = [
        ("requests", decision.request_wait_ms),
        ("tokens", decision.token_wait_ms),
        ("concurrency", concurrency_ms),
    ]
    limit: LimitName = "concurrency"
    wait = 0
    for name, limit_wait in waits:
        if limit_wait > wait:
            limit, wait = name, limit_wait
    return replace(decision, limit=limit, retry_after_ms=wait)
