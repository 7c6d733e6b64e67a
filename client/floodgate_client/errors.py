"""Typed errors: one class per answer a caller handles differently, all under FloodgateError."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from floodgate_client.events import Usage
from floodgate_client.rate_limits import RateLimits


class FloodgateError(Exception):
    """An error answer from the edge, in OpenAI's error-object shape, or a failure to reach it."""

    # An error in a stream that asked for usage (include_usage): what the request was charged, which
    # the edge sends just before the error (the prompt and the tokens that came, or 0 if nothing).
    usage: Usage | None = None

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.type = type
        self.code = code
        self.param = param
        self.headers: dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}

    @property
    def request_id(self) -> str | None:
        """The edge's id for the request (x-request-id; a stream's own id for an error raised reading
        it, a cut included), for support and logs; None where no answer came."""
        return self.headers.get("x-request-id")

    @property
    def retry_after_s(self) -> float | None:
        """The wait the answer advises before another try, or None: on any error, as a 502 from a
        restarting replica says it too, not only a 429 or 503."""
        return retry_after_s(self.headers)

    @property
    def should_retry(self) -> bool | None:
        """The server's word on sending the request again (`x-should-retry`, or an error event's
        `should_retry`): False where the request may be what failed (one that killed its replica
        would kill the next), None where it said nothing. A StreamError after text is never sent
        again by the client, its text cannot be taken back; a caller that retries it reads this and
        `retry_after_s` first."""
        return {"true": True, "false": False}.get(self.headers.get("x-should-retry", ""))


class AuthenticationError(FloodgateError):
    """401/403: the API key is missing, unknown or revoked."""


class BadRequestError(FloodgateError):
    """400/413/422: the request itself is wrong (bad field, prompt over the context, body too large)."""


class NotFoundError(FloodgateError):
    """404: unknown route, model or request id (another user's request ids read as unknown too)."""


class ConflictError(FloodgateError):
    """409: the request is already finished, so it cannot be cancelled."""


class RateLimitError(FloodgateError):
    """429. `limit` says which: requests, tokens, concurrency, queue_full or wait_too_long."""

    @property
    def limit(self) -> str | None:
        # A rate limit names its limit as the type (code "rate_limit_exceeded", as OpenAI's do);
        # an overload names its reason as the code.
        return self.type if self.code == "rate_limit_exceeded" else self.code

    @property
    def rate_limits(self) -> RateLimits:
        return RateLimits.from_headers(self.headers)


class ServiceUnavailableError(FloodgateError):
    """503: the limiter store is down and the tier fails closed; `retry_after_s` says when to retry."""


class StreamError(FloodgateError):
    """An error event in the middle of a stream (the generation failed after it had started), or a
    stream the client could not read (a malformed chunk, a body whose content-encoding is broken)."""


class NetworkError(FloodgateError):
    """The connection failed or broke (connect, read, or the stream ended without its last event)."""


_BY_STATUS: dict[int, type[FloodgateError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: BadRequestError,
    422: BadRequestError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


# A longer advertised wait is no hint: no limiter's window is a century, and time.sleep refuses a
# wait past about 292 years (OverflowError), as it does an infinite one.
_MAX_WAIT_S = 100 * 365.25 * 86400


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The server's advertised wait: `retry-after-ms` (exact) first, then `Retry-After` (s or HTTP
    date). One that is not a wait (`inf`, `nan`, a century or more) is no hint, as an error event's
    is (decoder.py): a caller's time.sleep(retry_after_s) raised OverflowError on an infinite one."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            wait = _wait(float(millis) / 1000.0)
        except ValueError:
            wait = None
        if wait is not None:
            return wait
    seconds = lowered.get("retry-after")
    if seconds is None:
        return None
    try:
        return _wait(float(seconds))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(seconds)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        # HTTP dates are GMT; the asctime form (and a "-0000" zone) parse naive, not as local time.
        when = when.replace(tzinfo=UTC)
    return _wait(when.timestamp() - time.time())


def _wait(seconds: float) -> float | None:
    """`seconds` as a wait (one already over is none: 0), or None where it is no hint."""
    if not math.isfinite(seconds) or seconds > _MAX_WAIT_S:
        return None
    return max(0.0, seconds)


def naming(error: FloodgateError, request_id: str | None) -> FloodgateError:
    """`error`, naming the request whose stream raised it (its `request_id`) where it names none: a
    reply cut after the edge had taken it (charged, its turn stored) raised a NetworkError with no
    id, which out of `create()`, whose stream the caller never holds, tied it to nothing."""
    if request_id is not None:
        error.headers.setdefault("x-request-id", request_id)
    return error


def transport_failure(what: str, exc: Exception) -> NetworkError:
    """A NetworkError for an httpx failure; raise it `from transport_cause(exc)`. A LocalProtocolError
    (h11 refusing what we would send) quotes the offending header value, which may be the API key."""
    if isinstance(exc, httpx.LocalProtocolError):
        return NetworkError(f"{what}: the request could not be sent (an invalid header or body)")
    return NetworkError(f"{what}: {what_happened(exc)}")


def what_happened(exc: Exception) -> str:
    """The failure in words. The sync transport's exceptions carry the socket's own ("timed out",
    "[Errno 104] Connection reset by peer"); the async one's are empty (anyio raises TimeoutError() and
    BrokenResourceError()), so a timeout says so, and another failure gives the first OS error among
    its causes, or at least its type."""
    if text := str(exc):
        return text
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    cause = exc.__cause__ or exc.__context__
    for _ in range(8):  # a few links: httpx's, httpcore's, anyio's, then the OS error
        if cause is None:
            break
        if isinstance(cause, OSError) and str(cause):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


def transport_cause(exc: Exception) -> Exception | None:
    """The exception to chain: not one that may quote the key, which a traceback would print."""
    return None if isinstance(exc, httpx.LocalProtocolError) else exc


def error_from_json(
    payload: Mapping[str, Any], *, unshaped: str = "unknown error", **extra: Any
) -> dict[str, Any]:
    """The keyword arguments of an error from an OpenAI error object (or anything less tidy); its
    message `unshaped` where the object has none."""
    error = payload.get("error")
    if not isinstance(error, Mapping):
        error = {}
    return {
        "message": _text(error, "message") or unshaped,
        "type": _text(error, "type"),
        "code": _text(error, "code"),
        "param": _text(error, "param"),
        **extra,
    }


def _text(error: Mapping[str, Any], key: str) -> str | None:
    value = error.get(key)
    return None if value is None else str(value)


def error_from_response(status_code: int, headers: Mapping[str, str], body: bytes) -> FloodgateError:
    """The error an answer says. A body that is no OpenAI error object (a proxy's or gateway's page or
    JSON in front of the edge: `{"message": ...}`, `{"detail": ...}`, `{"error": "..."}`) is the
    message as it came: JSON of another shape said only "unknown error", the proxy's words lost."""
    as_text = body.decode("utf-8", errors="replace").strip()[:500] or f"HTTP {status_code}"
    try:
        payload = json.loads(body)
    except ValueError:
        payload = {}
    if not isinstance(payload, Mapping):
        payload = {}
    cls = _BY_STATUS.get(status_code, FloodgateError)
    return cls(**error_from_json(payload, unshaped=as_text, status_code=status_code, headers=headers))


def error_from_unread_response(
    status_code: int, headers: Mapping[str, str], exc: Exception
) -> FloodgateError:
    """An error answer whose body broke off as it was read (a proxy's reset, a read timeout) or could
    not be decoded (its content-encoding broken): its status and headers came whole and say which
    error it is (and its wait); only the message is lost. httpx's own exception escaped `stream()`
    and `cancel()` before, past every `except FloodgateError`."""
    cls = _BY_STATUS.get(status_code, FloodgateError)
    unread = "undecodable" if isinstance(exc, httpx.DecodingError) else "cut off"
    message = f"HTTP {status_code}, its body {unread}: {what_happened(exc)}"
    return cls(message, status_code=status_code, headers=headers)


def undecodable_stream(exc: httpx.DecodingError, headers: Mapping[str, str]) -> StreamError:
    """A stream whose body could not be decoded (its content-encoding broken: a proxy's garbage): a
    StreamError, as a malformed chunk is, not a NetworkError, which the client reopens before the
    first text and callers retry: the same answer would likely come again, and be generated again."""
    return StreamError(f"the stream could not be decoded: {what_happened(exc)}", headers=headers)


def cancel_status(status_code: int, headers: Mapping[str, str], body: bytes) -> str:
    """The status a cancel's answer reports ("CANCELLED"). An error answer raises as its class; so does
    a 200 that is not the edge's JSON (a proxy's or captive portal's page), which json() let escape as
    a bare ValueError, past every `except FloodgateError`, a `with` block's exit among them."""
    if status_code != 200:
        raise error_from_response(status_code, headers, body)
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    status = payload.get("status") if isinstance(payload, Mapping) else None
    if not isinstance(status, str):
        text = body.decode("utf-8", errors="replace")[:200]
        raise FloodgateError(
            f"unexpected answer to a cancel: {text}", status_code=status_code, headers=headers
        )
    return status
