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
    headers = {
        "x-ratelimit-limit-requests": str(decision.limit_requests),
        "x-ratelimit-remaining-requests": str(decision.remaining_requests),
        "x-ratelimit-reset-requests": openai_duration(decision.reset_requests_ms),
        "x-ratelimit-limit-tokens": str(decision.limit_tokens),
        "x-ratelimit-remaining-tokens": str(decision.remaining_tokens),
        "x-ratelimit-reset-tokens": openai_duration(decision.reset_tokens_ms),
    }
    if not decision.allowed:
        headers["retry-after"] = str(-(-decision.retry_after_ms // 1000))
        headers["retry-after-ms"] = str(decision.retry_after_ms)
    return headers
