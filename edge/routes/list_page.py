"""A page of a list endpoint, answered as OpenAI's list endpoints answer one: the items as `data`,
the ids of its first and last (the next page's `after` is `last_id`) and whether more follow."""

from __future__ import annotations

from typing import Any

from litestar.response.base import ASGIResponse

from edge.routes.json_body import json_response


def list_page(
    data: list[dict[str, Any]],
    has_more: bool,
    headers: dict[str, str] | None = None,
    **about: Any,
) -> ASGIResponse:
    """`about`: what the page is of, said beside the items (a conversation's id)."""
    return json_response(
        {
            "object": "list",
            **about,
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        },
        headers=headers,
    )
