"""A request's one Authorization header, read alike by every route.

Several Authorization headers are refused rather than one of them picked: the chat route read the
raw headers and kept the last, the other routes Litestar's `headers.get`, the first, so one
request could authenticate as one key on one route and another key on the next, and a proxy or
WAF that checks or meters the first header could see a different credential from the one the edge
bills (a review). Authorization is not a list header (RFC 9110 §5.3): a second one is a malformed
request, a 400 for the client to fix.
"""

from __future__ import annotations

from litestar.types import Scope

from edge.errors import ApiError, invalid_request


def several_authorization_headers() -> ApiError:
    return invalid_request(
        "Send one Authorization header: this request has several.", None, code="several_authorization_headers"
    )


def authorization_header(scope: Scope) -> str | None:
    """The request's Authorization header (None without one); a 400 when it has several."""
    found: str | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if found is not None:
                raise several_authorization_headers()
            found = value.decode("latin-1")
    return found
