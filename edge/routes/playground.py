"""GET /: the playground page, when the package ships it.

The page is served with a Content-Security-Policy that lets only its own inline script and style
run (by their SHA-256) and lets it talk only to this origin: model output and error text are put in
the page as text, and the policy is the second line should a later change ever insert markup, so
an injected handler or script never runs and nothing leaves for another host. The page may not be
framed (clickjacking a page holding a pasted key), and its type is not sniffed."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from litestar import get
from litestar.response.base import ASGIResponse

from edge.errors import ApiError

PLAYGROUND = Path(__file__).resolve().parent.parent / "static" / "playground.html"

_INLINE = {
    "script": re.compile(rb"<script>(.*?)</script>", re.S),
    "style": re.compile(rb"<style>(.*?)</style>", re.S),
}


def _hashes(page: bytes, tag: str) -> str:
    digests = (hashlib.sha256(body).digest() for body in _INLINE[tag].findall(page))
    return " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests) or "'none'"


def security_headers(page: bytes) -> dict[str, str]:
    """The page's own policy: its inline script and style by hash, fetches to this origin only, its
    favicon a data: URL, and nothing else."""
    policy = "; ".join(
        (
            "default-src 'none'",
            f"script-src {_hashes(page, 'script')}",
            f"style-src {_hashes(page, 'style')}",
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    return {
        "content-security-policy": policy,
        "x-content-type-options": "nosniff",
        "x-frame-options": "DENY",  # browsers without frame-ancestors
        "referrer-policy": "no-referrer",
    }


@get("/", include_in_schema=False)
async def playground() -> ASGIResponse:
    if not PLAYGROUND.is_file():
        raise ApiError(404, "The playground page is not installed.", code="not_found")
    page = PLAYGROUND.read_bytes()
    # media_type without a charset: Litestar adds "; charset=utf-8" to text types itself.
    return ASGIResponse(body=page, media_type="text/html", headers=security_headers(page))
