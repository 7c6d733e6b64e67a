"""The edge settings the client and page tests run against (shared by tests/client and tests/browser).

free and free2: one request per second each, to reach a 429 and see its retry admitted quickly.
paid: roomy enough for 100 concurrent streams from one key.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class LongReply:
    """A request the random-weight demo model answers at length (over a thousand tokens, measured),
    so a test can stop it mid-way. Its replies end whenever it samples end-of-text: most end early."""

    prompt: str
    temperature: float | None = None
    seed: int | None = None


LONG_REPLIES = (
    LongReply("Tell me everything about stars.", temperature=0.0),  # no end-of-text in 1900 tokens
    LongReply("Tell me everything about rivers.", temperature=0.0),
    LongReply("Tell me everything about rain.", temperature=0.0),
    LongReply("Write a very long story, part 0.", temperature=0.0),
    LongReply("Write a very long story, part 0.", seed=4),
)
LONG_REPLY = LONG_REPLIES[0]
# The first tokens of that greedy reply: a short request sure to get text (sampling may end at once).
SURE_TEXT = {"messages": LONG_REPLY.prompt, "temperature": 0.0}
LONG_REPLY_TOKENS = 1900
