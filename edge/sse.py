"""Server-sent event encoding of the chat completion stream.

Every chunk of one stream shares its head (id, created, model), so it is encoded once and a text
delta costs one msgspec string encode plus a concatenation.

Each event is one line, for every reader of lines. JSON may carry U+0085, U+2028 and U+2029 raw,
and SSE ends a line only at CR or LF, but Python's `str.splitlines` ends one at each of them too,
and so does httpx's `aiter_lines`, the usual way to read a stream by hand in Python: a reply with
one of them arrived as two broken lines (found by the overload drill's httpx client, "Unterminated
string"). They are sent escaped (`\u2028`), which every JSON parser reads back as the same text.
ASCII text, nearly every delta, is checked by one `isascii` and passes untouched.
"""

from __future__ import annotations

from typing import Any

import msgspec

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"

_LINE_BREAKS_JSON_KEEPS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


_json = msgspec.json.encode


def _encode(payload: Any) -> bytes:
    """msgspec's JSON with the line breaks it leaves raw escaped (see the module doc)."""
    encoded = _json(payload)
    return encoded if encoded.isascii() else _escape_line_breaks(encoded)


def _escape_line_breaks(encoded: bytes) -> bytes:
    for raw, escaped in _LINE_BREAKS_JSON_KEEPS:
        if raw in encoded:
            encoded = encoded.replace(raw, escaped)
    return encoded


def event(payload: Any) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


class ChunkEncoder:
    __slots__ = ("_delta_head", "_head", "created", "model", "request_id")

    def __init__(self, request_id: str, model: str, created: int, service_tier: str | None = None) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self._head: dict[str, Any] = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        if service_tier is not None:
            # In every chunk, as OpenAI sends it (edge/schemas.py, answered_service_tier).
            self._head["service_tier"] = service_tier
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
        # _encode written out: this runs once per token of every stream.
        encoded = _json(text)
        if not encoded.isascii():
            encoded = _escape_line_breaks(encoded)
        return self._delta_head + encoded + b'},"finish_reason":null}]}\n\n'

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
