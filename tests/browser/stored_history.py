"""A conversation's stored messages served by a scripted edge, for the playground to read back."""

from __future__ import annotations

import json

from edge.routes.playground import PLAYGROUND
from tests.client.scripted_edge import served


def stored(number: int, role: str, content: str, request_id: str, finish: str | None) -> dict[str, object]:
    """A message as GET /v1/conversations/{id}/messages gives it."""
    return {"id": f"01J{number:023d}", "role": role, "content": content, "name": None,
            "request_id": request_id, "finish_reason": finish}  # fmt: skip


def playground_pages(conversation: str, messages: list[dict[str, object]]) -> dict[str, bytes]:
    """A ScriptedEdge's `pages`: the playground, and `conversation`'s messages as the one page the
    playground reads them in."""
    history = {"object": "list", "data": messages, "first_id": messages[0]["id"],
               "last_id": messages[-1]["id"], "has_more": False}  # fmt: skip
    return {
        "/": served(PLAYGROUND.read_bytes()),
        f"/v1/conversations/{conversation}/messages?limit=1000": served(
            json.dumps(history).encode(), "application/json"
        ),
    }
