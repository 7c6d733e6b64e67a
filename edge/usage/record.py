"""One usage row: what a user used of one model on one UTC day."""

from __future__ import annotations

import time
from dataclasses import dataclass


def utc_day(unix_s: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if unix_s is None else unix_s))


@dataclass(frozen=True, slots=True)
class Usage:
    user: str
    model: str
    day: str  # YYYY-MM-DD, UTC
    input_tokens: int
    output_tokens: int
    requests: int

    def as_dict(self) -> dict[str, str | int]:
        return {
            "user": self.user,
            "model": self.model,
            "date": self.day,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "requests": self.requests,
        }
