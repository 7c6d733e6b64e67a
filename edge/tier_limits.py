"""The edge's adapter from its [tiers] settings to the limiter's own tier type.

Two types on purpose: TierConfig is the settings file's shape (with what only the edge uses:
priority, queue wait), TierLimits is what the limiter enforces; the limiter imports nothing of
the edge.
"""

from __future__ import annotations

from edge.config import TierConfig
from limiter.tiers import TierLimits


def tier_limits(name: str, config: TierConfig) -> TierLimits:
    return TierLimits(
        name=name,
        requests_per_window=config.requests_per_window,
        request_window_s=config.request_window_s,
        tokens_per_window=config.tokens_per_window,
        token_window_s=config.token_window_s,
        max_concurrent=config.max_concurrent,
        max_tokens=config.max_tokens,
        on_store_failure=config.on_store_failure,
    )
