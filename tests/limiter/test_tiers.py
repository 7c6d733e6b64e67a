"""Tier limits from the settings file, and one instance's share of them."""

from __future__ import annotations

import pytest

from edge.config import load_settings
from limiter.policy import rates_for
from limiter.tiers import TierLimits, per_instance


def test_the_configured_tier_is_the_limiters_tier() -> None:
    free = load_settings().tiers["free"]
    assert isinstance(free, TierLimits)
    assert (free.requests_per_window, free.request_window_s) == (20, 10800)
    assert (free.tokens_per_window, free.token_window_s) == (40000, 86400)
    assert (free.max_concurrent, free.max_tokens, free.on_store_failure) == (2, 1024, "open")


def test_each_of_n_instances_enforces_a_share_never_below_one() -> None:
    free = load_settings().tiers["free"]
    share = per_instance(free, 3)
    assert (share.requests_per_window, share.tokens_per_window, share.max_concurrent) == (6, 13333, 1)
    # Each share refills at exactly 1/3 of the tier's rate, whatever the burst's rounding (20 // 3).
    whole, third = rates_for(free), rates_for(share)
    interval = lambda window, capacity: window / capacity  # noqa: E731
    assert interval(third.request_window_us, third.request_capacity) == pytest.approx(
        3 * interval(whole.request_window_us, whole.request_capacity), abs=3
    )
    assert interval(third.token_window_us, third.token_capacity) == pytest.approx(
        3 * interval(whole.token_window_us, whole.token_capacity), abs=3
    )
    assert per_instance(free, 1) is free
