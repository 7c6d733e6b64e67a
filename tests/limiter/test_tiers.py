"""Tier limits from the settings file, and one instance's share of them."""

from __future__ import annotations

from edge.config import load_settings
from edge.tier_limits import tier_limits
from limiter.tiers import per_instance


def test_tier_limits_carry_the_configured_tier() -> None:
    free = tier_limits("free", load_settings().tiers["free"])
    assert (free.name, free.requests_per_window, free.request_window_s) == ("free", 20, 10800)
    assert (free.tokens_per_window, free.token_window_s) == (40000, 86400)
    assert (free.max_concurrent, free.max_tokens, free.on_store_failure) == (2, 1024, "open")


def test_each_of_n_instances_enforces_a_share_never_below_one() -> None:
    free = tier_limits("free", load_settings().tiers["free"])
    share = per_instance(free, 3)
    assert (share.requests_per_window, share.tokens_per_window, share.max_concurrent) == (6, 13333, 1)
    assert share.request_window_s == free.request_window_s
    assert per_instance(free, 1) is free
