"""The edge settings the client and page tests run against (shared by tests/client and tests/browser).

free and free2: one request per second each, to reach a 429 and see its retry admitted quickly.
paid: roomy enough for 100 concurrent streams from one key.
"""

from __future__ import annotations

from typing import Any

_ROOMY_TIER: dict[str, Any] = {
    "priority": 10,
    "requests_per_window": 100_000,
    "request_window_s": 60.0,
    "tokens_per_window": 100_000_000,
    "token_window_s": 60.0,
    "max_concurrent": 200,
    "max_tokens": 2048,
    "max_queue_wait_s": 60.0,
    "on_store_failure": "open",
}

OVERRIDES: dict[str, Any] = {
    "tiers": {
        "paid": _ROOMY_TIER,
        "free": {**_ROOMY_TIER, "priority": 0, "requests_per_window": 1, "request_window_s": 1.0},
    },
}

# Long enough that a reply is still streaming when a test stops it; a random-weight model may still
# end early on its own, which the cancel tests tolerate by retrying with another seed.
LONG_REPLY_TOKENS = 1500


def long_prompt(attempt: int) -> str:
    """A prompt for a reply meant to run long; `attempt` varies it when a seed happened to end early."""
    return f"Write a very long story, part {attempt}."
