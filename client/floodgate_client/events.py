"""What a chat stream yields, as it arrives, and what a whole reply comes to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Prompt tokens the replica served from its prefix cache (`prompt_tokens_details.cached_tokens`,
    # as OpenAI names it): a conversation's later turns and a shared system prompt cost less.
    cached_tokens: int = 0

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Usage:
        prompt = int(raw.get("prompt_tokens", 0))
        completion = int(raw.get("completion_tokens", 0))
        details = raw.get("prompt_tokens_details") or {}
        return cls(
            prompt,
            completion,
            int(raw.get("total_tokens", prompt + completion)),
            int(details.get("cached_tokens", 0)),
        )


@dataclass(frozen=True, slots=True)
class RequestStarted:
    """The server accepted the request; `request_id` is what the cancel endpoint takes."""

    request_id: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of a stream. `reason` is "stop" or "length" (OpenAI's finish_reason).

    `cancelled`: the generation was stopped by a cancel. `limit_reached`: which budget cut it short
    ("tokens"), or None. `usage` is None when the server sent no usage chunk, or, after the stream's
    own cancel(), none within the short wait the client gives the rest of the stream (CANCEL_DRAIN_S).
    """

    reason: str
    usage: Usage | None
    cancelled: bool = False
    limit_reached: str | None = None


StreamEvent = RequestStarted | TextDelta | Finished


@dataclass(frozen=True, slots=True)
class ChatResult:
    """A whole reply. `cancelled` and `limit_reached` as in Finished: without them a reply cut by a
    cancel read as whole ("stop"), and one cut by the token budget as one max_tokens ended ("length")."""

    text: str
    finish_reason: str
    usage: Usage | None
    request_id: str
    cancelled: bool = False
    limit_reached: str | None = None

    @classmethod
    def of(cls, text: str, finished: Finished, request_id: str | None) -> ChatResult:
        return cls(
            text,
            finished.reason,
            finished.usage,
            request_id or "",
            finished.cancelled,
            finished.limit_reached,
        )
