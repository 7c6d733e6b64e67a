"""Floodgate's Python client: streaming chat completions from the edge, sync and async (httpx only)."""

from client.async_client import AsyncChatStream, AsyncClient
from client.client import ChatStream, Client
from client.errors import (
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
from client.events import ChatResult, Finished, RequestStarted, StreamEvent, TextDelta, Usage
from client.rate_limits import RateLimits

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
