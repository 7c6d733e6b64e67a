"""Cross-origin requests from browsers (CORS), answered as OpenAI's API and vLLM answer them.

A web app calling the API from the browser (the openai SDK's `dangerouslyAllowBrowser`, a chat UI
with a key of its own) first sends a preflight, `OPTIONS` with `Origin` and
`Access-Control-Request-Method`; without `Access-Control-Allow-*` in the answer the browser never
sends the request, and without `Access-Control-Allow-Origin` on the answer itself it hides the
reply, a 429's too, from the page: the app saw a bare "CORS error" where api.openai.com, and vLLM
with its default `--allowed-origins '*'`, serve it. `[server] cors_allow_origins` says which
origins may (`"*"`: any, the default; empty: none, no CORS header at all).

Any origin is safe to allow: the API authenticates by the Authorization header, which a browser
never adds on its own (no cookie), so another site's page can do only what its own key lets it.
Credentials mode is never allowed, so the wildcards hold (`Access-Control-Expose-Headers: *` lets
the page, and the SDK's retries, read Retry-After, x-request-id and the x-ratelimit-* headers);
Authorization is the one request header a wildcard does not cover, so a preflight's requested
headers are echoed instead.

It wraps the whole app, outside Litestar's exception handling, so every answer a browser can be
given carries the headers, its refusals included; the answers the HTTP protocol writes itself, where
no request reached the app (a 431, a 408 at the header deadline, a 400 for what the parser refuses),
carry the same (CrossOrigins.refusal_lines). Litestar's own OPTIONS answer (its 204, its
Allow header, a 404 where the listener does not serve the path: edge/routes/listeners.py) is the
preflight's answer; only a successful one says what may follow. A request without an Origin
(every server-side client) passes as it is, with no wrapper on its sends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

# How long a browser may reuse a preflight's answer (it caps this itself: Chromium at 2 hours).
_MAX_AGE_S = b"7200"


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class CrossOrigins:
    """The origins whose pages may read the answers (`[server] cors_allow_origins`), and the headers
    that tell a browser so: one home for the answers the app writes (allow_cross_origin) and those
    the HTTP protocol writes itself (edge/closing_refusal.py)."""

    __slots__ = ("_allowed", "any_origin")

    def __init__(self, origins: Sequence[str]) -> None:
        self.any_origin = "*" in origins
        self._allowed = frozenset(origin.encode("latin-1") for origin in origins)

    def headers(self, origin: bytes | None, *, preflight: bool = False) -> list[tuple[bytes, bytes]]:
        """The headers of an answer to a request from `origin` (None: it sent none, and gets none)."""
        if origin is None or not (self.any_origin or origin in self._allowed):
            return []
        extra = [(b"access-control-allow-origin", b"*" if self.any_origin else origin)]
        if not self.any_origin:
            extra.append((b"vary", b"Origin"))
        if not preflight:
            extra.append((b"access-control-expose-headers", b"*"))
        return extra

    def refusal_lines(self, origin: bytes | None) -> bytes:
        """The header lines of an answer the HTTP protocol writes itself (a 431, a 408 at the header
        deadline, a request the parser refuses), where the app never ran: without them a page on
        another origin could not read why its call failed. `origin`: the request's Origin as far as
        its head was read; where that was not far enough (None), any origin allowed is still said,
        since that answer is the same whatever the origin."""
        if origin is None and self.any_origin:
            origin = b"*"
        return b"".join(b"%s: %s\r\n" % pair for pair in self.headers(origin))


def allow_cross_origin(app: ASGIApp, origins: Sequence[str]) -> ASGIApp:
    """`app` answering browsers from `origins` ("*" among them: any); `app` itself where none."""
    if not origins:
        return app
    allowed = CrossOrigins(origins)

    def cors(scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # A plain function handing back the inner app's coroutine, as edge/routes/head.py's: no
        # frame of its own on every request's way.
        if scope["type"] != ScopeType.HTTP:
            return app(scope, receive, send)
        origin = _header(scope, b"origin")
        if origin is None:
            return app(scope, receive, send)
        requested = _header(scope, b"access-control-request-method")
        preflight = scope["method"] == "OPTIONS" and requested is not None
        extra = allowed.headers(origin, preflight=preflight)
        if not extra:
            return app(scope, receive, send)
        return app(scope, receive, _with_headers(send, extra, scope if preflight else None))

    return cors


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]], preflight: Scope | None) -> Send:
    async def send_with(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            headers += extra
            if preflight is not None and 200 <= message["status"] < 300:
                headers += _preflight_answer(preflight, headers)
            message = {**message, "headers": headers}
        await send(message)

    return send_with


def _preflight_answer(scope: Scope, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """What a successful preflight allows: the path's methods (its Allow header) and the headers
    the browser asked to send."""
    allow = next((value for key, value in headers if key.lower() == b"allow"), None)
    answer = [(b"access-control-max-age", _MAX_AGE_S)]
    if allow is not None:
        answer.append((b"access-control-allow-methods", bytes(allow)))
    asked = _header(scope, b"access-control-request-headers")
    if asked:
        answer.append((b"access-control-allow-headers", asked))
    return answer
