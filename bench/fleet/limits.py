"""Per-user request and token limits, as the limiter enforces them: requests per window and tokens
(input + output) per window, checked and counted in one step. Fixed windows here (the limiter's own
windows are its business; what matters at fleet scale is which share of traffic a limit turns away).
A simulated user is a cohort of `bundle` users acting alike, so one cohort's count is one user's."""

from __future__ import annotations

from bench.fleet.tiers import Tier


class UserLimits:
    def __init__(self, tiers: dict[str, Tier]) -> None:
        self._tiers = tiers
        self._requests: dict[tuple[str, int, int], int] = {}
        self._tokens: dict[tuple[str, int, int], int] = {}

    def admit(self, tier: str, user: int, now: float, tokens: int) -> bool:
        """Count this request if both limits allow it; False is a 429."""
        t = self._tiers[tier]
        rkey = (tier, user, int(now // t.request_window_s))
        tkey = (tier, user, int(now // t.token_window_s))
        if self._requests.get(rkey, 0) + 1 > t.requests_per_window:
            return False
        if self._tokens.get(tkey, 0) + tokens > t.tokens_per_window:
            return False
        self._requests[rkey] = self._requests.get(rkey, 0) + 1
        self._tokens[tkey] = self._tokens.get(tkey, 0) + tokens
        return True
