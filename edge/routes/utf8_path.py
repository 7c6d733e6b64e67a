"""A path whose percent-decoded bytes are no UTF-8 is refused, not read as another path.

The ASGI server hands the path decoded with replacement (uvicorn: urllib.parse.unquote), so every
byte that is no UTF-8 arrives as U+FFFD: /v1/conversations/%ff/messages read the conversation
named "\\ufffd", which /v1/conversations/%EF%BF%BD/messages names, and so did %fe, %c0%af and any
other. The raw path (ASGI's `raw_path`, still percent-encoded) tells them apart.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from litestar.types import Scope

from edge.errors import invalid_request


def refuse_undecodable_path(scope: Scope, param: str) -> None:
    """A 400 naming `param`, the route's one segment of the caller's choosing (its others are
    ASCII), when the request's path is no UTF-8 once percent-decoded. An ASGI server that sends no
    `raw_path` (it is optional) leaves nothing to tell apart: the path is taken as given."""
    raw = scope.get("raw_path")
    if raw is None:
        return
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_request(
            f"Invalid '{param}': it is not UTF-8 once percent-decoded (encode its UTF-8 bytes).",
            param,
            code="invalid_value",
        ) from None
