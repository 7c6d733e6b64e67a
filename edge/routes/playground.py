"""GET /: the playground page, when the package ships it."""

from __future__ import annotations

from pathlib import Path

from litestar import get
from litestar.response.base import ASGIResponse

from edge.errors import ApiError

PLAYGROUND = Path(__file__).resolve().parent.parent / "static" / "playground.html"


@get("/", include_in_schema=False)
async def playground() -> ASGIResponse:
    if not PLAYGROUND.is_file():
        raise ApiError(404, "The playground page is not installed.", code="not_found")
    return ASGIResponse(body=PLAYGROUND.read_bytes(), media_type="text/html; charset=utf-8")
