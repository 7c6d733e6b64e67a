"""What the edge asks of a limiter. The algorithm lives in policy.py; stores implement this protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

# The limiter's own tier type (the edge's [tiers] settings extend it: edge/config.py TierConfig).
from limiter.tiers import TierLimits as TierLimits

LimitName = Literal["requests", "tokens", "concurrency"]


@dataclass(slots=True)
class Decision:
    """One admission answer, with what the x-ratelimit-* headers report. Not changed once made (a
    refined answer is a `dataclasses.replace` copy), but not `frozen`: a frozen dataclass sets each
    of these eleven fields through `object.__setattr__`, 4.1 µs a decision against 1.1, and every
    stream is admitted once (docs/bench-streams.md, sixth pass)."""

    allowed: bool
    limit: LimitName | None  # which limit denied; None when allowed
    retry_after_ms: int  # exact wait until this request would be allowed; 0 when allowed
    limit_requests: int
    remaining_requests: int
    reset_requests_ms: int
    limit_tokens: int
    remaining_tokens: int
    reset_tokens_ms: int
    # What the request and token limits alone would make this request wait (0: they allow it).
    # A concurrency denial's wait is refined after the store answers (limiter/stream_ends.py),
    # and the longer of these may then be the real wait.
    request_wait_ms: int = 0
    token_wait_ms: int = 0


class OutputLease(Protocol):
    """Output tokens reserved for one running generation, charged as they stream."""

    def try_take(self, n: int) -> int | None:
        """`take` without a coroutine, for the per-token path: the answer while the local lease
        covers n (or the budget is known spent), None when only `take` can answer (a store call)."""
        ...

    async def take(self, n: int) -> int:
        """Charge n generated tokens; returns how many of them the budget covers (n, or fewer when
        the token budget ran out: the generation must then stop). Talks to the store only when the
        local lease is used up, to extend it by a batch. Raises StoreUnavailable when that store
        cannot answer and the tier fails closed: the generation must stop then too, but not as
        the budget's end."""
        ...

    def give_back(self, n: int) -> None:
        """Return n tokens taken that paid for nothing delivered: a weighted model's (edge/models/
        token_weight.py) part of a token at the budget's end, which no whole token can use. They are
        held by the lease again, and refunded when it settles unless taken anew."""
        ...

    @property
    def charged(self) -> int:
        """The tokens this request holds of the budget, in its units: its input and the output it
        was granted. All given back when it settles with ran=False (what its headers then say);
        settled with ran=True, its input and the output it used (the rest was refunded)."""
        ...

    async def settle(self, *, ran: bool = True, cancelled: bool = False) -> bool | None:
        """Refund the unused lease and free the concurrency slot. Idempotent; call in a finally.

        ran=False: the request is not charged (it never reached a replica, turned away after
        admission, e.g. the queue was full; or its client got nothing but an error), so admission
        is undone whole: the request, its input tokens and the whole lease, tokens taken from it
        included, are all given back.

        cancelled=True: a cancel answered on this edge instance ended the request. A shared store
        records it with the settle (no call of its own): another instance, asked to cancel it again
        (a client retrying its cancel), answers CANCELLED as this one did, not 409.

        Returns True when the shared store's record of the request says a cancel sent to another
        edge instance came first (edge/cancel/bus.py marks it there): the outcome must then be
        reported as cancelled. False when it says not; None when no shared store answered (the
        in-process store, a store that is down, or a second call)."""
        ...


@dataclass(frozen=True, slots=True)
class Admission:
    decision: Decision
    lease: OutputLease | None  # set when allowed


class StoreUnavailable(Exception):
    """The shared store failed and the tier is fail-closed: answer 503 with Retry-After."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("rate limit store unavailable")
        self.retry_after_s = retry_after_s


class Limiter(Protocol):
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
        """One atomic decision over requests, tokens (input + an initial output lease) and
        concurrency. A prompt larger than the tier's whole token budget can never be admitted
        (no wait helps): check `input_tokens <= tier.tokens_per_window` before asking.
        `asked_output_tokens`: the reply a refusal's wait makes room for (policy.reply_to_wait_for): the
        max_tokens the client named, or the user's usual reply (the edge's pipeline; the tier's
        largest, filled in by the server, told a free user to wait 37 minutes); None, the lease
        only."""
        ...

    async def aclose(self) -> None: ...
