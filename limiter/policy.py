"""The limiting algorithm, pure: the reference that scripts/*.lua mirror line for line.

Requests and tokens both use GCRA (the generic cell rate algorithm, a token bucket stored as one
number: the theoretical arrival time, TAT). A limit of L per window W becomes an emission interval
I = W / L: a cost of c moves the TAT forward by its span, c * I rounded up to a whole microsecond,
and is allowed when the new TAT lies no further than W ahead of now.

Why GCRA and not fixed windows or a sliding-window counter:
- No double burst at a window edge. A fixed window hands back the whole quota at the boundary, so
  L at the end of one window plus L at the start of the next lands 2L in an instant. GCRA never
  hands back more than it has earned: at most L at once, then one unit per I, so any span of
  length d admits at most L + d / I. The sliding-window counter only approximates that (it assumes
  the previous window's traffic was spread evenly).
- The wait is exact: a denied cost is allowed in exactly (new TAT - now - L * I), so Retry-After
  is an answer, not a guess (not "the whole window").
- Cost-weighted and refundable: tokens are the same algorithm with cost = tokens, and an unused
  output lease is refunded by moving the TAT back.
- O(1) state per user and limit, one key each, which expires by itself once the TAT has passed.

Concurrency is a per-user set of live request ids, each with its own expiry (a lease TTL that
every charge refreshes), so a slot held by a dead edge instance frees itself.

All times are integer microseconds and every quantity stays below 2**53, so Lua's doubles and
Python's ints compute identical results. The interval alone is a double, W / L, and the two
computations that use it (a span, the room left) are the same IEEE operations in the same order on
both sides (limiter/scripts/gcra.lua), so they agree too. It was rounded up to a whole microsecond
once per tier, which costs nothing at usual rates but held fast ones far under their setting: 40M
tokens a minute (1.5 µs a token) enforced as 30M, 150M as 60M. Now a span is rounded once per
charge, a microsecond at most, over a cost of many tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from limiter.base import Decision, LimitName, TierLimits

MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class Rates:
    """A tier's limits as the integers the algorithm works on: each budget's capacity per window."""

    request_window_us: int
    request_capacity: int
    token_window_us: int
    token_capacity: int
    max_concurrent: int


def rates_for(tier: TierLimits) -> Rates:
    return Rates(
        request_window_us=round(tier.request_window_s * MICROS),
        request_capacity=tier.requests_per_window,
        token_window_us=round(tier.token_window_s * MICROS),
        token_capacity=tier.tokens_per_window,
        max_concurrent=tier.max_concurrent,
    )


# A span a hair over a whole microsecond is that microsecond (a cost of the whole capacity spans
# exactly the window, whatever the double's last bit), and the room a hair under a unit is that
# unit. Far above the doubles' rounding error on any window (1e-5 µs on a day's), far below a unit.
_SPAN_SLACK_US = 0.001
_ROOM_SLACK = 0.000001


def span_us(cost: int, window_us: int, capacity: int) -> int:
    """How far `cost` units move the TAT: cost * (window / capacity), rounded up (gcra.lua's span)."""
    return math.ceil(cost * (window_us / capacity) - _SPAN_SLACK_US)


@dataclass(slots=True)
class UserState:
    """One user's limiter state: the two TATs and the live leases (request id -> expiry)."""

    request_tat_us: int = 0
    token_tat_us: int = 0
    leases: dict[str, int] = field(default_factory=dict)

    def is_idle(self, now_us: int) -> bool:
        """True when dropping this state changes nothing (what key expiry does in Redis)."""
        return self.request_tat_us <= now_us and self.token_tat_us <= now_us and not self.leases


@dataclass(frozen=True, slots=True)
class Gcra:
    """The outcome of charging `cost` against one GCRA limit at `now`: the TAT if it is allowed,
    and how long until it would be (0: allowed now)."""

    new_tat_us: int
    wait_us: int


def gcra(tat_us: int, now_us: int, window_us: int, capacity: int, cost: int) -> Gcra:
    new_tat = max(tat_us, now_us) + span_us(cost, window_us, capacity)
    return Gcra(new_tat, max(0, new_tat - (now_us + window_us)))


def remaining(tat_us: int, now_us: int, window_us: int, capacity: int) -> int:
    """The units the budget holds now (gcra.lua's room): none at worst. A TAT can lie past the
    window (restore.lua adding several edges' fallback counts, the fallback mirroring more than its
    share): that much owed is a longer wait, not fewer than no units left, and the
    x-ratelimit-remaining-* headers said -3 requests and -300 tokens."""
    room = math.floor((now_us + window_us - max(tat_us, now_us)) / (window_us / capacity) + _ROOM_SLACK)
    return max(0, room)


def reset_us(tat_us: int, now_us: int) -> int:
    """Time until the limit is back to its initial, full state."""
    return max(tat_us, now_us) - now_us


def ceil_ms(us: int) -> int:
    return (us + 999) // 1000


def prune_expired(leases: dict[str, int], now_us: int) -> None:
    for request_id in [rid for rid, expiry in leases.items() if expiry <= now_us]:
        del leases[request_id]


def initial_lease(rates: Rates, batch_tokens: int, input_tokens: int, max_output_tokens: int) -> int:
    """The output tokens reserved at admission: one batch, but never more than the request may
    generate, nor so many that input + lease could not fit even an untouched budget (a small
    budget then still admits the request and its stream stops when the budget is spent)."""
    return max(0, min(batch_tokens, max_output_tokens, rates.token_capacity - input_tokens))


def reply_to_wait_for(
    rates: Rates, input_tokens: int, lease_tokens: int, asked_output_tokens: int | None
) -> int:
    """The output tokens a refusal's wait makes room for beside the prompt: the reply asked for
    (limiter/base.py's `asked_output_tokens`), as far as an untouched budget holds it; the lease
    where none was."""
    if asked_output_tokens is None:
        return lease_tokens
    return max(0, min(asked_output_tokens, rates.token_capacity - input_tokens))


def admit(
    state: UserState,
    rates: Rates,
    now_us: int,
    request_id: str,
    input_tokens: int,
    lease_tokens: int,
    lease_ttl_us: int,
    reply_tokens: int,
) -> Decision:
    """Check requests, tokens (input + the initial output lease) and concurrency together; when all
    three allow, count the request, debit the tokens and add the lease. Mutates `state`.

    A refused request is told to wait until the reply it asked for fits too (`reply_tokens`,
    reply_to_wait_for), not only its lease: told when the lease fits, a client that waited was
    admitted and its reply cut by the budget a few tokens in, its prompt charged again each time (a
    review, the OpenAI SDK retrying: 636 output tokens for 5,025 prompt tokens in 37 s). Admission
    itself still asks only for the lease, as the design wants (the budget stops a reply with a
    marker).

    Idempotent per request id: asking again for a request that holds its slot answers "allowed"
    and counts nothing (a retried call must not count twice)."""
    prune_expired(state.leases, now_us)
    if request_id in state.leases:
        return _decision(state, rates, now_us, None, 0, 0, 0)
    requests = gcra(state.request_tat_us, now_us, rates.request_window_us, rates.request_capacity, 1)
    tokens = gcra(
        state.token_tat_us,
        now_us,
        rates.token_window_us,
        rates.token_capacity,
        input_tokens + lease_tokens,
    )
    # The store's bound: the earliest lease expiry, when a slot frees even if its holder died.
    # When a live stream ends the store cannot know; the caller lowers this to its estimate
    # (limiter/stream_ends.py), so the other two waits go back with the decision.
    concurrency_wait = 0
    if len(state.leases) >= rates.max_concurrent:
        earliest = min(state.leases.values(), default=now_us)
        concurrency_wait = max(1, earliest - now_us)

    waits: list[tuple[LimitName, int]] = [
        ("requests", requests.wait_us),
        ("tokens", tokens.wait_us),
        ("concurrency", concurrency_wait),
    ]
    limit, wait = _binding(waits)
    if limit is None:
        state.request_tat_us = requests.new_tat_us
        state.token_tat_us = tokens.new_tat_us
        state.leases[request_id] = now_us + lease_ttl_us
        return _decision(state, rates, now_us, None, 0, requests.wait_us, tokens.wait_us)
    if reply_tokens > lease_tokens:
        whole = gcra(
            state.token_tat_us,
            now_us,
            rates.token_window_us,
            rates.token_capacity,
            input_tokens + reply_tokens,
        )
        waits[1] = ("tokens", whole.wait_us)
        limit, wait = _binding(waits)
    return _decision(state, rates, now_us, limit, wait, requests.wait_us, waits[1][1])


def _binding(waits: list[tuple[LimitName, int]]) -> tuple[LimitName | None, int]:
    """The binding limit: the one with the longest wait; on a tie the first in this order."""
    limit: LimitName | None = None
    wait = 0
    for name, limit_wait in waits:
        if limit_wait > wait:
            limit, wait = name, limit_wait
    return limit, wait


def _decision(
    state: UserState,
    rates: Rates,
    now_us: int,
    limit: LimitName | None,
    wait_us: int,
    request_wait_us: int,
    token_wait_us: int,
) -> Decision:
    return Decision(
        allowed=limit is None,
        limit=limit,
        retry_after_ms=ceil_ms(wait_us),
        limit_requests=rates.request_capacity,
        remaining_requests=remaining(
            state.request_tat_us, now_us, rates.request_window_us, rates.request_capacity
        ),
        reset_requests_ms=ceil_ms(reset_us(state.request_tat_us, now_us)),
        limit_tokens=rates.token_capacity,
        remaining_tokens=remaining(state.token_tat_us, now_us, rates.token_window_us, rates.token_capacity),
        reset_tokens_ms=ceil_ms(reset_us(state.token_tat_us, now_us)),
        request_wait_ms=ceil_ms(request_wait_us) if limit else 0,
        token_wait_ms=ceil_ms(token_wait_us) if limit else 0,
    )


def charge(state: UserState, rates: Rates, now_us: int, request_id: str, want: int, lease_ttl_us: int) -> int:
    """Extend a running request's output lease by up to `want` tokens: all of it when the budget
    covers it, else what the budget still holds (0: the generation must stop). Refreshes the
    request's slot expiry if it still holds one. Mutates `state`; returns the tokens granted."""
    available = remaining(state.token_tat_us, now_us, rates.token_window_us, rates.token_capacity)
    granted = min(want, available)
    if granted > 0:
        state.token_tat_us = max(state.token_tat_us, now_us) + _token_span(rates, granted)
    if state.leases.get(request_id, now_us) > now_us:  # held, not lapsed: an expired slot is gone
        state.leases[request_id] = now_us + lease_ttl_us
    return granted


def settle(
    state: UserState, rates: Rates, now_us: int, request_id: str, refund_tokens: int, refund_request: bool
) -> bool:
    """Free the request's slot and refund `refund_tokens` (and the request itself when
    `refund_request`). Only the call that removes the slot refunds, so settling twice (or after
    the slot expired) refunds nothing. Returns whether it removed the slot."""
    expiry = state.leases.pop(request_id, None)
    if expiry is None or expiry <= now_us:  # settled, or lapsed (what admit's prune removes)
        return False
    refund(state, rates, now_us, refund_tokens, refund_request)
    return True


def refund(state: UserState, rates: Rates, now_us: int, refund_tokens: int, refund_request: bool) -> None:
    """Give back `refund_tokens` (and the request itself when `refund_request`): a settle's refund,
    apart from its slot (the ledger refunds a settle whose restore was never sent after it)."""
    if refund_tokens > 0:
        state.token_tat_us = max(state.token_tat_us - _token_span(rates, refund_tokens), now_us)
    if refund_request:
        state.request_tat_us = max(state.request_tat_us - _request_span(rates), now_us)


def record_admitted(
    state: UserState, rates: Rates, now_us: int, request_id: str, cost_tokens: int, lease_ttl_us: int
) -> None:
    """Count a request the shared store admitted (or may have admitted) into this state, whatever
    its limits say: the local state then continues from what this instance really let through,
    so a fallback to it never starts from zero. Mutates `state`."""
    state.request_tat_us = max(state.request_tat_us, now_us) + _request_span(rates)
    state.token_tat_us = max(state.token_tat_us, now_us) + _token_span(rates, cost_tokens)
    state.leases[request_id] = now_us + lease_ttl_us


def record_charged(
    state: UserState, rates: Rates, now_us: int, request_id: str, granted: int, lease_ttl_us: int
) -> None:
    """Count tokens the shared store granted to a running request (see record_admitted)."""
    if granted > 0:
        state.token_tat_us = max(state.token_tat_us, now_us) + _token_span(rates, granted)
    if state.leases.get(request_id, now_us) > now_us:
        state.leases[request_id] = now_us + lease_ttl_us


def _token_span(rates: Rates, tokens: int) -> int:
    return span_us(tokens, rates.token_window_us, rates.token_capacity)


def _request_span(rates: Rates) -> int:
    return span_us(1, rates.request_window_us, rates.request_capacity)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a state holds, relative to now: how far each TAT is ahead, and the live requests."""

    request_ahead_us: int
    token_ahead_us: int
    request_ids: tuple[str, ...]


def snapshot(state: UserState, now_us: int) -> Snapshot:
    prune_expired(state.leases, now_us)
    return Snapshot(
        request_ahead_us=max(0, state.request_tat_us - now_us),
        token_ahead_us=max(0, state.token_tat_us - now_us),
        request_ids=tuple(state.leases),
    )
