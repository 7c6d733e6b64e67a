"""What the client sends: the chat request body, the endpoints and the auth header."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

CHAT_PATH = "/v1/chat/completions"

# A message is an OpenAI message object: its content a string or a list of text parts, a `name` beside
# it; the edge reads each (README); `str` values only refused the parts in an application's type check.
Messages = Sequence[Mapping[str, Any]] | str


def edge_root(base_url: str) -> str:
    """The edge's root, from a base URL given either as that or as the OpenAI SDK's convention, the
    root plus `/v1` (what the README's SDK example passes): this client adds `/v1` itself, so that one
    reached `/v1/v1/...` and said only "Not Found".

    Raises httpx.InvalidURL for a host no lookup can take (an empty label, a doubled dot: httpx
    takes it, and the first request raised getaddrinfo's UnicodeError from its IDNA encoding, no
    FloodgateError, out of every call), as httpx does for a malformed port. What is checked is the
    name the lookup gets, httpx's ASCII host (punycode for a non-ASCII one, encoded by IDNA 2008),
    not its Unicode form: Python's IDNA 2003 codec refuses names IDNA 2008 allows (an Arabic or
    Hebrew label ending in a digit), which httpx reaches."""
    url = httpx.URL(base_url)
    try:
        url.raw_host.decode("ascii").encode("idna")
    except UnicodeError:
        raise httpx.InvalidURL(f"Invalid host: {url.host!r}") from None
    return base_url.rstrip("/").removesuffix("/v1")


def cancel_path(request_id: str) -> str:
    return f"{CHAT_PATH}/{quote(request_id, safe='')}/cancel"


def auth_headers(api_key: str) -> dict[str, str]:
    """A key read from a file or an environment variable often ends in a newline: that is trimmed. A
    control character left inside is refused here, without the key in the message: httpx would
    refuse it later with the whole header value (the key) in its exception."""
    key = api_key.strip()
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in key):
        raise ValueError("the API key contains a control character")
    return {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}


def finite(name: str, value: float) -> float:
    """`value`, refused when JSON cannot carry it (NaN, an infinity): httpx's encoding raised "Out of
    range float values are not JSON compliant", naming no parameter, from inside the send."""
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value}")
    return value


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A streamed chat completion. A bare string as `messages` is one user message; no `model`: the
    edge answers with the key's default model (its tier's) at each send."""

    messages: Messages
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    conversation_id: str | None = None

    def __post_init__(self) -> None:
        """Raises ValueError for a sampling setting no JSON body can carry, before anything is sent."""
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if value is not None:
                finite(name, value)

    def body(self) -> dict[str, Any]:
        messages = (
            [{"role": "user", "content": self.messages}]
            if isinstance(self.messages, str)
            else [dict(message) for message in self.messages]
        )
        body: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            # Usage comes in its own chunk before [DONE]; Finished carries it.
            "stream_options": {"include_usage": True},
        }
        optional: dict[str, Any] = {
            # Left out, "": the edge answers with the key's default model of the moment (its tier's,
            # after a set-tier too), where a default the client looked up once went stale.
            "model": "" if self.model is None else self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop if self.stop is None or isinstance(self.stop, str) else list(self.stop),
            "conversation_id": self.conversation_id,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        return body
