"""A request body must arrive in time: a client that sends less than its Content-Length (or trickles
it) would otherwise hold its connection and handler for ever, since neither uvicorn nor Litestar
bounds the wait for body bytes.

ASGI middleware: until the body is complete, each `receive()` is bounded by one deadline counted
from the request's start. Past it the handler's body read raises ApiError 408, answered as an OpenAI
error object with `connection: close` (the rest of that body is never read, so the connection
cannot carry another request). After the body, `receive()` is the plain one again: a stream's
disconnect watch must not time out.

The bound is asyncio's own `timeout_at`, not an anyio `fail_after`: every request passes here, and
anyio's scope (its backend look-up, `sniffio`, a generator context manager) cost about 1.5 % of a
one-token stream's CPU for a body that uvicorn had almost always buffered already
(docs/bench-streams.md).
"""

from __future__ import annotations

import asyncio

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from edge.errors import ApiError


def body_timeout_error(timeout_s: float) -> ApiError:
    return ApiError(
        408,
        f"The request body did not arrive within {timeout_s:g} s.",
        code="request_timeout",
        headers={"connection": "close"},
    )


class BodyReadTimeout:
    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self._app = app
        self._timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        body_done = False

        async def receive_in_time() -> ReceiveMessage:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise body_timeout_error(self._timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await self._app(scope, receive_in_time, send)
