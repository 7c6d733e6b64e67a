"""A model's token weight, applied where the edge charges the limiter.

Limits are per user across models, in "weighted tokens": a model with `token_weight = 2` charges
two of a user's tokens for each of its own, input and output alike. The limiter itself knows
nothing of models; this wraps it for one model. Usage records stay in real tokens (the pipeline
records what it relayed).
"""

from __future__ import annotations

import math

from limiter.base import Admission, Limiter, OutputLease
from limiter.tiers import TierLimits

# Float products such as 3 * 1.1 land a hair above the integer they mean.
_EPSILON = 1e-9


def weighted(tokens: int, weight: float) -> int:
    """What `tokens` of a model with this weight cost, rounded up (a token never costs nothing)."""
    return math.ceil(tokens * weight - _EPSILON)


class WeightedLimiter:
    """A Limiter whose charges count each token `weight` times."""

    def __init__(self, inner: Limiter, weight: float) -> None:
        self._inner = inner
        self.weight = weight

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
        w = self.weight
        asked = None if asked_output_tokens is None else weighted(asked_output_tokens, w)
        admission = await self._inner.admit(
            user,
            request_id,
            tier,
            weighted(input_tokens, w),
            weighted(max_output_tokens, w),
            asked_output_tokens=asked,
        )
        if admission.lease is None:
            return admission
        return Admission(admission.decision, WeightedLease(admission.lease, w, input_tokens))

    async def aclose(self) -> None:
        """The shared limiter is closed by the app that made it, once."""


class WeightedLease:
    """An OutputLease in real tokens over one in weighted tokens.

    Charges are rounded up on the running total with the prompt's, not per call nor apart from the
    prompt, so a request costs ceil((prompt + reply) * weight) however its tokens arrive: rounded
    apart, 17 + 3 tokens at 1.5 cost 26 + 5, one more than the 30 they come to (a review).
    """

    def __init__(self, inner: OutputLease, weight: float, prompt_tokens: int = 0) -> None:
        self._inner = inner
        self._weight = weight
        self._prompt = prompt_tokens
        self._tokens = prompt_tokens  # real tokens paid for so far, the prompt's included
        self._charged = weighted(prompt_tokens, weight)  # weighted tokens charged so far

    def _cost(self, n: int) -> int:
        return weighted(self._tokens + n, self._weight) - self._charged

    def try_take(self, n: int) -> int | None:
        cost = self._cost(n)
        if cost <= 0:
            self._tokens += n
            return n
        got = self._inner.try_take(cost)
        return None if got is None else self._granted(n, cost, got)

    async def take(self, n: int) -> int:
        cost = self._cost(n)
        if cost <= 0:
            self._tokens += n
            return n
        return self._granted(n, cost, await self._inner.take(cost))

    def _granted(self, n: int, cost: int, got: int) -> int:
        self._charged += got
        if got >= cost:
            self._tokens += n
            return n
        # The budget ran out: as many real tokens as the weighted ones granted pay for in full.
        covered = min(n, max(0, math.floor(self._charged / self._weight + _EPSILON) - self._tokens))
        self._tokens += covered
        # The rest of the grant is part of a token never delivered: kept, the request cost one
        # weighted token more than its count rounded up (budget 7 at 1.5, prompt 2 and 2 tokens
        # out: 7 spent for the 6 they come to).
        self._return_unpaid()
        return covered

    def give_back(self, n: int) -> None:
        self._tokens = max(self._prompt, self._tokens - n)  # taken tokens only, never the prompt
        self._return_unpaid()

    def _return_unpaid(self) -> None:
        """Give the inner lease back what was charged beyond the tokens kept, rounded up."""
        unpaid = self._charged - weighted(self._tokens, self._weight)
        if unpaid > 0:
            self._inner.give_back(unpaid)
            self._charged -= unpaid

    @property
    def charged(self) -> int:
        return self._inner.charged  # in weighted tokens, as the decision counts them

    async def settle(self, *, ran: bool = True, cancelled: bool = False) -> bool | None:
        return await self._inner.settle(ran=ran, cancelled=cancelled)


def weigh(limiter: Limiter, weight: float) -> Limiter:
    """The limiter as one model charges it; itself at weight 1 (no cost on the token path)."""
    return limiter if weight == 1.0 else WeightedLimiter(limiter, weight)
