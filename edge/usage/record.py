"""One usage row: what a user used of one model on one UTC day."""

from __future__ import annotations

import time
from dataclasses import dataclass

_SECONDS_A_DAY = 86_400
# The last day stamped and the [start, end) of it: every request's usage row is stamped, and
# formatting the date (gmtime + strftime) was a third of recording one (2 of 6 µs).
_today = ("", 0.0, 0.0)


def utc_day(unix_s: float | None = None) -> str:
    """The UTC date of `unix_s` (None: now), YYYY-MM-DD."""
    global _today
    at = time.time() if unix_s is None else unix_s
    day, start, end = _today
    if start <= at < end:  # a time before the day kept (a clock stepped back) formats again
        return day
    start = at - at % _SECONDS_A_DAY  # UTC days are whole multiples of 86,400 s of Unix time
    _today = (day := time.strftime("%Y-%m-%d", time.gmtime(start)), start, start + _SECONDS_A_DAY)
    return day


@dataclass(frozen=True, slots=True)
class Usage:
    user: str
    model: str
    day: str  # YYYY-MM-DD, UTC
    input_tokens: int
    output_tokens: int
    requests: int
    # Of input_tokens, those the replica served from its prefix cache: the sum of the completions'
    # usage.prompt_tokens_details.cached_tokens, as OpenAI's usage API reports input_cached_tokens.
    # Without it a user could not reconcile the cached tokens their replies reported with the bill.
    # Last, with a default: a row of a store or log written before it had none.
    input_cached_tokens: int = 0

    def as_dict(self) -> dict[str, str | int]:
        return {
            "user": self.user,
            "model": self.model,
            "date": self.day,
            "input_tokens": self.input_tokens,
            "input_cached_tokens": self.input_cached_tokens,
            "output_tokens": self.output_tokens,
            "requests": self.requests,
        }
