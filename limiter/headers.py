"""The x-ratelimit-* and Retry-After headers for a decision, as OpenAI's API sends them."""

from __future__ import annotations

from limiter.base import Decision


def openai_duration(ms: int) -> str:
    """A duration the way OpenAI's reset headers write it (Go's format): "20ms", "1s", "1.5s",
    "6m0s", "1h2m3s"."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    text = f"{seconds}.{millis:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


def ratelimit_headers(decision: Decision) -> dict[str, str]:
    d = decision
    headers = request_headers(d.limit_requests, d.remaining_requests, d.reset_requests_ms)
    headers["x-ratelimit-limit-tokens"] = str(d.limit_tokens)
    headers["x-ratelimit-remaining-tokens"] = str(d.remaining_tokens)
    headers["x-ratelimit-reset-tokens"] = openai_duration(d.reset_tokens_ms)
    if not d.allowed:
        headers["retry-after"] = str(-(-d.retry_after_ms // 1000))
        headers["retry-after-ms"] = str(d.retry_after_ms)
    return headers


def request_headers(limit: int, remaining: int, reset_ms: int) -> dict[str, str]:
    """A requests budget's three headers (the chat route's, and the history reads' alone)."""
    return {
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": openai_duration(reset_ms),
    }
