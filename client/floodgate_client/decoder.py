"""Turns the edge's SSE events (OpenAI chat.completion.chunk objects) into typed stream events.

Shared by the sync and async streams: it holds what the stream has seen so far (request id, text,
the finish reason) and knows when a reply is complete.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from floodgate_client.errors import (
    FloodgateError,
    NetworkError,
    RateLimitError,
    ServiceUnavailableError,
    StreamError,
    error_from_json,
)
from floodgate_client.events import Finished, RequestStarted, StreamEvent, TextDelta, Usage
from floodgate_client.rate_limits import parse_duration_s
from floodgate_client.sse import ServerSentEvent

# A request the edge admitted into its queue and then refused there (queue full, the wait too long, no
# replica left) is refused in the stream it had already opened: the same refusal as its 429/503. So
# is a stream whose limiter store went away mid-way on a fail-closed tier (the 503 a new request gets),
# and one the edge's drain cut (its instance shutting down): before its first text that is the 503 a
# new request to that instance gets, costs nothing, stores no turn, and says to retry elsewhere.
# After text (a drain or the store's loss cuts a reply under way) it is no such refusal: as an
# upstream_error after text, a StreamError without a status, its code and wait kept. As a 503 a
# caller's own retry of 503s sent it again and showed the text that came a second time.
_OVERLOADS: dict[str, tuple[type[FloodgateError], int]] = {
    "queue_full": (RateLimitError, 429),
    "wait_too_long": (RateLimitError, 429),
    "no_replica": (ServiceUnavailableError, 503),
    "limiter_unavailable": (ServiceUnavailableError, 503),
    "server_shutting_down": (ServiceUnavailableError, 503),
}
# A replica that failed before the stream's first text: the edge refunded the request and stored
# nothing of it, as for the 502 it answers a request not streamed, which auto_retry sends again (the
# edge says when, or not to, in the event: `retry_after_ms`, `should_retry`). After text it is not:
# the text that came cannot be taken back, and a reopened stream would start the reply over.
_UPSTREAM_FAILED, _UPSTREAM_STATUS = "upstream_error", 502
# The event has no headers: the edge writes its wait in the error object (`retry_after_ms`), and
# an overload's message says it too, as OpenAI writes it ("try again in 2.5s.").
_TRY_AGAIN_IN = re.compile(r"try again in ([0-9][0-9.hms]*)")


class ChunkDecoder:
    def __init__(self) -> None:
        self.request_id: str | None = None
        self.finished: Finished | None = None
        self.saw_text = False
        # An error event ended the stream on the server (its request is over there).
        self.ended_by_error = False
        # That error ended the request with nothing of its reply sent (an overload refusal, a
        # replica's failure before any text): auto_retry may send it again under a new id.
        self.refused = False
        self._text: list[str] = []
        self._finish_reason: str | None = None
        self._cancelled = False
        self._limit_reached: str | None = None
        self._usage: Usage | None = None

    @property
    def text(self) -> str:
        return "".join(self._text)

    def feed(self, event: ServerSentEvent) -> list[StreamEvent]:
        if self.finished is not None:
            return []
        if event.is_done:
            return [self._finish()]
        payload = self._parse(event.data)
        if "error" in payload or event.event == "error":
            error = stream_error(payload, self.request_id, self.saw_text)
            error.usage = self._usage
            # The server ended the stream with it (its [DONE] follows): nothing left there to cancel.
            self.ended_by_error = True
            self.refused = error.status_code is not None
            raise error
        out: list[StreamEvent] = []
        if self.request_id is None:
            request_id = payload.get("request_id") or payload.get("id")
            if isinstance(request_id, str) and request_id:
                self.request_id = request_id
                out.append(RequestStarted(request_id))
        marker = payload.get("floodgate")
        if isinstance(marker, dict):
            self._cancelled = self._cancelled or bool(marker.get("cancelled"))
            limit = marker.get("limit_reached")
            self._limit_reached = str(limit) if limit else self._limit_reached
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._usage = Usage.from_json(usage)
        for choice in payload.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                self._text.append(content)
                self.saw_text = True
                out.append(TextDelta(content))
            if choice.get("finish_reason"):
                self._finish_reason = str(choice["finish_reason"])
        return out

    def end_of_stream(self) -> list[StreamEvent]:
        """The connection closed. Complete if the final chunk came (even without [DONE]), else broken."""
        if self.finished is not None:
            return []
        if self._finish_reason is not None:
            return [self._finish()]
        raise NetworkError("the stream ended before its final chunk")

    def finish_cancelled(self) -> Finished:
        """The server confirmed a cancel and the connection was closed before its final chunk."""
        self._cancelled = True
        self._finish_reason = self._finish_reason or "stop"
        return self._finish()

    def _finish(self) -> Finished:
        self.finished = Finished(
            reason=self._finish_reason or "stop",
            usage=self._usage,
            cancelled=self._cancelled,
            limit_reached=self._limit_reached,
        )
        return self.finished

    @staticmethod
    def _parse(data: str) -> dict[str, Any]:
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise StreamError(f"malformed stream chunk: {data[:200]!r}") from exc
        if not isinstance(payload, dict):
            raise StreamError(f"malformed stream chunk: {data[:200]!r}")
        return payload


def stream_error(payload: dict[str, Any], request_id: str | None, saw_text: bool = False) -> FloodgateError:
    """An error event: an overload before any text (`saw_text`) as the RateLimitError (or
    ServiceUnavailableError) it would have been before the stream opened, with its status and wait;
    anything else a StreamError, with the edge's retry hint (its wait, `retry_after_s`;
    `should_retry`), and the 502's status where a replica's failure came before any text. Each
    carries the stream's request id, as an error answer does (x-request-id), for support and logs."""
    fields = error_from_json(payload)
    headers = {} if request_id is None else {"x-request-id": request_id}
    error = payload.get("error")
    wait_ms = _advertised_wait_ms(error, fields["message"])
    if wait_ms is not None:
        headers["retry-after-ms"] = str(round(wait_ms))
    if isinstance(error, dict) and isinstance(error.get("should_retry"), bool):
        headers["x-should-retry"] = "true" if error["should_retry"] else "false"
    overload = _OVERLOADS.get(fields["code"] or "")
    if overload is not None and not saw_text:
        cls, status_code = overload
        return cls(**fields, status_code=status_code, headers=headers)
    refunded = fields["code"] == _UPSTREAM_FAILED and not saw_text
    return StreamError(**fields, status_code=_UPSTREAM_STATUS if refunded else None, headers=headers)


def _advertised_wait_ms(error: Any, message: str) -> float | None:
    if isinstance(error, dict):
        for key, scale in (("retry_after_ms", 1.0), ("retry_after_s", 1000.0)):
            if isinstance(error.get(key), int | float):
                return _finite_ms(error[key], scale)
    found = _TRY_AGAIN_IN.search(message)
    seconds = None if found is None else parse_duration_s(found.group(1).rstrip("."))
    return None if seconds is None else _finite_ms(seconds, 1000.0)


def _finite_ms(value: float, scale: float) -> float | None:
    """`value` times `scale`, or None (no hint) where no float holds it: Python's json reads 1e400
    and Infinity as an infinity and NaN as NaN, which round() refuses, and an integer of any length,
    which float() refuses; each escaped the stream as OverflowError or ValueError, not a
    FloodgateError."""
    try:
        millis = float(value) * scale
    except OverflowError:
        return None
    return millis if math.isfinite(millis) else None
