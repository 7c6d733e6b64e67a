"""Tiers the limiter tests use."""

from __future__ import annotations

from limiter.base import TierLimits


def tier(
    *,
    requests: int = 1000,
    request_window_s: float = 60.0,
    tokens: int = 1_000_000,
    token_window_s: float = 60.0,
    concurrent: int = 1000,
    max_tokens: int = 4096,
    on_store_failure: str = "open",
    name: str = "",
) -> TierLimits:
    assert on_store_failure in ("open", "closed")
    return TierLimits(
        requests_per_window=requests,
        request_window_s=request_window_s,
        tokens_per_window=tokens,
        token_window_s=token_window_s,
        max_concurrent=concurrent,
        max_tokens=max_tokens,
        on_store_failure="open" if on_store_failure == "open" else "closed",
        name=name,
    )
