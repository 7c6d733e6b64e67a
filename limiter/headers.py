"""The x-ratelimit-* and Retry-After headers for a decision, as OpenAI's API sends them."""

from __future__ import annotations

from dataclasses import replace

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


def refunded_headers(decision: Decision, tokens: int) -> dict[str, str]:
    """The headers of an admitted request given back whole (its request, and `tokens` of the token
    budget: its input and the output it was granted), as OpenAI's describe the budget after the
    request: what the user has left once the refund is made. The decision's own say it charged, and
    told a user with one request an hour left that it had none. The refund is counted at the
    decision's instant. Each unit refills at the same pace, so the reset shortens by the refunded
    units' share of the missing ones (exact to within one unit's refill)."""
    d = decision
    requests, rest_requests = _given_back(d.limit_requests, d.remaining_requests, d.reset_requests_ms, 1)
    tokens_left, rest_tokens = _given_back(d.limit_tokens, d.remaining_tokens, d.reset_tokens_ms, tokens)
    return ratelimit_headers(
        replace(
            d,
            remaining_requests=requests,
            reset_requests_ms=rest_requests,
            remaining_tokens=tokens_left,
            reset_tokens_ms=rest_tokens,
        )
    )


def settled_headers(decision: Decision, tokens: int) -> dict[str, str]:
    """The headers of an admitted request whose reply was charged in full before they go out (an
    answer not streamed): the budget once `tokens` more than its admission charged are spent (fewer
    where negative: its unused lease refunded). The admission's own said only the prompt and a
    first lease spent: a reply the budget cut was answered with tokens still remaining. Counted
    at the decision's instant, as `refunded_headers`; the reset lengthens by the units' share."""
    d = decision
    if tokens < 0:
        remaining, reset_ms = _given_back(d.limit_tokens, d.remaining_tokens, d.reset_tokens_ms, -tokens)
    else:
        missing = d.limit_tokens - d.remaining_tokens
        spent = min(d.limit_tokens, missing + tokens)
        remaining = d.limit_tokens - spent
        # Each unit refills at the same pace; a decision with none missing says no pace, and then
        # a request charged anything was charged nothing at admission (none on record).
        reset_ms = d.reset_tokens_ms * spent // missing if missing else d.reset_tokens_ms
    return ratelimit_headers(replace(d, remaining_tokens=remaining, reset_tokens_ms=reset_ms))


def _given_back(limit: int, remaining: int, reset_ms: int, units: int) -> tuple[int, int]:
    """One budget's remaining units and reset once `units` are given back."""
    missing = limit - remaining
    if units >= missing:
        return limit, 0
    return remaining + units, reset_ms * (missing - units) // missing


def request_headers(limit: int, remaining: int, reset_ms: int) -> dict[str, str]:
    """A requests budget's three headers (the chat route's, and the history reads' alone)."""
    return {
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": openai_duration(reset_ms),
    }
