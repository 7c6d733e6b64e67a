"""TierLimits from the settings, and the reduced limits one instance applies on its own."""

from __future__ import annotations

import dataclasses

from edge.config import TierConfig
from limiter.base import TierLimits


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


def per_instance(tier: TierLimits, instance_count: int) -> TierLimits:
    """The share of each limit one of `instance_count` edge instances enforces alone (fail-open
    fallback), so that all instances together stay within the tier. Never below 1."""
    if instance_count <= 1:
        return tier
    return dataclasses.replace(
        tier,
        requests_per_window=max(1, tier.requests_per_window // instance_count),
        tokens_per_window=max(1, tier.tokens_per_window // instance_count),
        max_concurrent=max(1, tier.max_concurrent // instance_count),
    )
