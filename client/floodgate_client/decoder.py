"""Turns the edge's SSE events (OpenAI chat.completion.chunk objects) into typed stream events.

Shared by the sync and async streams: it holds what the stream has seen so far (request id, text,
the finish reason) and knows when a reply is complete.
"""

from __future__ import annotations

import json
from typing import Any

from floodgate_client.errors import NetworkError, StreamError, error_from_json
from floodgate_client.events import Finished, RequestStarted, StreamEvent, TextDelta, Usage
from floodgate_client.sse import ServerSentEvent


class ChunkDecoder:
    def __init__(self) -> None:
        self.request_id: str | None = None
        self.finished: Finished | None = None
        self.saw_text = False
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
            raise StreamError(**error_from_json(payload))
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
