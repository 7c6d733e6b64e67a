"""The headers the edge sends with every answer, and Retry-After on a denial."""

from __future__ import annotations

import pytest

from limiter.base import Decision
from limiter.headers import openai_duration, ratelimit_headers


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (20, "20ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (360_000, "6m0s"),
        (3_723_004, "1h2m3.004s"),
        (10_800_000, "3h0m0s"),
    ],
)
def test_durations_are_written_the_way_openai_writes_them(ms: int, text: str) -> None:
    assert openai_duration(ms) == text


def _decision(allowed: bool, retry_after_ms: int) -> Decision:
    return Decision(
        allowed=allowed,
        limit=None if allowed else "tokens",
        retry_after_ms=retry_after_ms,
        limit_requests=20,
        remaining_requests=19,
        reset_requests_ms=540_000,
        limit_tokens=40_000,
        remaining_tokens=39_000,
        reset_tokens_ms=2_160,
    )


def test_allowed_answers_carry_the_ratelimit_headers_without_retry_after() -> None:
    assert ratelimit_headers(_decision(True, 0)) == {
        "x-ratelimit-limit-requests": "20",
        "x-ratelimit-remaining-requests": "19",
        "x-ratelimit-reset-requests": "9m0s",
        "x-ratelimit-limit-tokens": "40000",
        "x-ratelimit-remaining-tokens": "39000",
        "x-ratelimit-reset-tokens": "2.16s",
    }


def test_denials_add_retry_after_rounded_up_and_the_exact_ms() -> None:
    headers = ratelimit_headers(_decision(False, 6_401))
    assert headers["retry-after"] == "7"
    assert headers["retry-after-ms"] == "6401"
