"""The chat completions request as clients send it, decoded and checked in one msgspec pass.

Unknown fields are ignored (clients send many we do not use); wrong types and out-of-range values
become a 400 naming the parameter.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from edge.errors import ApiError, invalid_request

Role = Literal["system", "developer", "user", "assistant", "tool"]


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: Role
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text or "" for part in self.content if part.type == "text")


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ChatCompletionRequest(msgspec.Struct):
    model: str
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    stream: bool = False
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], msgspec.Meta(max_length=4)] | None = None
    stream_options: StreamOptions | None = None
    user: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    n: int | None = None
    conversation_id: Annotated[str, msgspec.Meta(max_length=256)] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_PATH = re.compile(r"at `\$\.?(?P<path>[^`]*)`")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


def _param_of(message: str) -> str | None:
    path = _PATH.search(message)
    missing = _MISSING.search(message)
    parts = [p for p in (path.group("path") if path else "", missing.group("field") if missing else "") if p]
    return ".".join(parts) if parts else None


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    try:
        req = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise invalid_request(f"Invalid request: {exc}", _param_of(str(exc))) from None
    except msgspec.DecodeError:
        raise invalid_request("We could not parse the JSON body of your request.", None) from None
    if req.n is not None and req.n != 1:
        raise invalid_request("Only n=1 is supported.", "n")
    return req


def unknown_model(name: str) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")
