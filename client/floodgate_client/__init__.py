"""Floodgate's Python client: streaming chat completions from the edge, sync and async (httpx only).

    from floodgate_client import Client, TextDelta, Finished

    with Client("http://127.0.0.1:8000", api_key) as floodgate:
        with floodgate.chat.stream("Tell me about rivers", max_tokens=200) as stream:
            for event in stream:              # RequestStarted, TextDelta..., Finished
                if isinstance(event, TextDelta):
                    print(event.text, end="", flush=True)
        # leaving the block early cancels the generation on the server; stream.cancel() does it now
        reply = floodgate.chat.create("Hi", auto_retry=True)   # ChatResult; 429s, 5xx retried

`AsyncClient` is the same with `async with` / `async for` / `await`. Errors are FloodgateError
subclasses (each carries `retry_after_s`, the advised wait; RateLimitError `limit` too);
`stream.rate_limits` reads the x-ratelimit-* headers.
"""

from floodgate_client.async_client import AsyncChatStream, AsyncClient
from floodgate_client.client import ChatStream, Client
from floodgate_client.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    FloodgateError,
    NetworkError,
    NotFoundError,
    RateLimitError,
    ServiceUnavailableError,
    StreamError,
)
from floodgate_client.events import ChatResult, Finished, RequestStarted, StreamEvent, TextDelta, Usage
from floodgate_client.rate_limits import RateLimits

__all__ = [
    "AsyncChatStream",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "ChatResult",
    "ChatStream",
    "Client",
    "ConflictError",
    "Finished",
    "FloodgateError",
    "NetworkError",
    "NotFoundError",
    "RateLimitError",
    "RateLimits",
    "RequestStarted",
    "ServiceUnavailableError",
    "StreamError",
    "StreamEvent",
    "TextDelta",
    "Usage",
]
