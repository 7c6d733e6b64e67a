"""The limits a response reports in its x-ratelimit-* headers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration_s(text: str) -> float | None:
    """OpenAI's reset format ("1s", "6m0s", "20ms", "1h2m3.5s"), or a bare number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def _int(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _duration(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    return None if value is None else parse_duration_s(value)


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Each field is None when the server did not send its header."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RateLimits:
        lowered = {k.lower(): v for k, v in headers.items()}
        return cls(
            limit_requests=_int(lowered, "x-ratelimit-limit-requests"),
            remaining_requests=_int(lowered, "x-ratelimit-remaining-requests"),
            reset_requests_s=_duration(lowered, "x-ratelimit-reset-requests"),
            limit_tokens=_int(lowered, "x-ratelimit-limit-tokens"),
            remaining_tokens=_int(lowered, "x-ratelimit-remaining-tokens"),
            reset_tokens_s=_duration(lowered, "x-ratelimit-reset-tokens"),
        )
