"""JSON answers encoded with msgspec, as raw ASGI responses."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar.response.base import ASGIResponse


def json_response(body: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> ASGIResponse:
    return ASGIResponse(
        body=msgspec.json.encode(body),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )
