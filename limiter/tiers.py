"""The limiter's tier type, and the reduced limits one instance applies on its own.

The limiter knows nothing of the edge's settings: the edge's [tiers] settings extend this type with
what only the edge reads (edge/config.py TierConfig), so each limit is declared once, here.
A frozen msgspec Struct: hashable (the stores key their rates by tier, on every call) at about half
a frozen dataclass's cost per lookup (118 against 256 ns), and decoded straight from the settings.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

# The shortest window a budget may have. The limiter counts whole microseconds (policy.rates_for), so
# a window under half of one was 0 there and divided every request's rates by zero (a 500 on each,
# from settings that loaded); the reset headers and Retry-After count whole milliseconds, so a
# shorter window could not be told to a client anyway. A millisecond keeps an edge's share of it
# (per_instance: at least half of it) whole microseconds too.
MIN_WINDOW_S = 0.001
# The longest: 100 years, the one bound on every duration the settings and the key API take (a
# key's lifetime, edge/keys/lifecycle.py; slot TTL and fleet timings, edge/config.py). Longer is a
# typo, never what was meant, and past what Redis takes: a window of 1e17 s loaded, and its
# microseconds reached admit.lua as a number Redis refused ("value is not an integer or out of
# range"), every admit a store failure (the local fallback's limits, or a 503 where the tier fails
# closed).
MAX_PERIOD_S = 100 * 365.25 * 86400
Window = Annotated[float, msgspec.Meta(ge=MIN_WINDOW_S, le=MAX_PERIOD_S)]


class TierLimits(msgspec.Struct, frozen=True, kw_only=True):
    # Checked where the settings are decoded: a budget of 0 divided every request's rates by zero.
    requests_per_window: Annotated[int, msgspec.Meta(ge=1)]
    request_window_s: Window
    tokens_per_window: Annotated[int, msgspec.Meta(ge=1)]
    token_window_s: Window
    max_concurrent: Annotated[int, msgspec.Meta(ge=1)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    on_store_failure: Literal["open", "closed"] = "open"
    # Reads of the conversation history (GET /v1/conversations/{id}/messages): a store read each,
    # limited in a budget of their own (limiter/reads.py) so that paging a history never spends the
    # chat completions' requests. 10 a second by default: a client paging a long history, or
    # reloading it after each reply, never meets it; a loop reading it does.
    history_reads_per_window: Annotated[int, msgspec.Meta(ge=1)] = 600
    history_read_window_s: Window = 60.0
    # The [tiers.NAME] table's name (the edge's settings set it): each tier a user is in has its own
    # budgets, kept in that tier's units. A budget holds time owed at its tier's rate (a GCRA TAT),
    # so one shared across tiers read a free key's spent day, moved to paid, as a paid day spent
    # (throttled for up to a day); rescaled on each move instead, two edges that disagree on a
    # user's tier (key caches, a rollout) refilled it at every alternation. Kept apart, a move
    # back finds that tier's budget as it was left. Concurrency stays the user's across tiers.
    name: str = ""


def per_instance(tier: TierLimits, instance_count: int) -> TierLimits:
    """The share of each limit one of `instance_count` edge instances enforces alone (fail-open
    fallback), so that all instances together stay within the tier: 1/n of each budget's burst
    (never below 1) refilling at exactly 1/n of the tier's rate, whatever the rounding of the burst.
    The rate is what restoring Redis after an outage relies on: the twin's lead on a budget, divided
    by n, is then the tier's (limiter/memory.py `snapshot`). With the window kept and the burst
    rounded down, 20 requests per 3 h on 3 instances refilled one per 30 min, not 27, and the
    restore pushed Redis past the whole window (remaining -3, Retry-After 29 min for 9)."""
    n = instance_count
    if n <= 1:
        return tier
    requests, request_window_s = share_of(tier.requests_per_window, tier.request_window_s, n)
    tokens, token_window_s = share_of(tier.tokens_per_window, tier.token_window_s, n)
    return msgspec.structs.replace(
        tier,
        requests_per_window=requests,
        request_window_s=request_window_s,
        tokens_per_window=tokens,
        token_window_s=token_window_s,
        max_concurrent=max(1, tier.max_concurrent // n),
    )


def share_of(per_window: int, window_s: float, instance_count: int) -> tuple[int, float]:
    """One of `instance_count` instances' share of a budget of `per_window` per `window_s`: 1/n of
    the burst (never below 1), and the window that refills it at exactly 1/n of the rate."""
    n = max(1, instance_count)
    burst = max(1, per_window // n)
    return burst, window_s * burst * n / per_window
