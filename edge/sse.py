"""Server-sent event encoding of the chat completion stream.

Every chunk of one stream shares its head (id, created, model), so it is encoded once and a text
delta costs one msgspec string encode plus a concatenation.
"""

from __future__ import annotations

from typing import Any

import msgspec

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"

_encode = msgspec.json.encode


def event(payload: Any) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


class ChunkEncoder:
    __slots__ = ("_delta_head", "_head", "created", "model", "request_id")

    def __init__(self, request_id: str, model: str, created: int) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self._head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self._delta_head = (
            b"data: " + _encode(self._head)[:-1] + b',"choices":[{"index":0,"delta":{"content":'
        )

    def first(self) -> bytes:
        return event(
            {
                **self._head,
                "request_id": self.request_id,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                ],
            }
        )

    def delta(self, text: str) -> bytes:
        return self._delta_head + _encode(text) + b'},"finish_reason":null}]}\n\n'

    def final(self, finish_reason: str, marker: dict[str, Any] | None) -> bytes:
        payload: dict[str, Any] = {
            **self._head,
            "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}],
        }
        if marker:
            payload["floodgate"] = marker
        return event(payload)

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> bytes:
        usage = usage_dict(prompt_tokens, completion_tokens, cached_tokens)
        return event({**self._head, "choices": [], "usage": usage})


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object. cached_tokens: prompt tokens the replica served from its prefix cache
    (always present, as vLLM sends it; 0 where the replica does not report it)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
