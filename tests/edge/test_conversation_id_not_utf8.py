"""A conversation's id in the history's URL is UTF-8 once percent-decoded, or the request is refused.

The ASGI server decodes the path with replacement (uvicorn: urllib.parse.unquote), so
/v1/conversations/%ff/messages read the conversation named "\ufffd": two different byte paths named
one conversation, and a client with a broken encoder read someone's turns it never named.
"""

from __future__ import annotations

import httpx

from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer

REPLACEMENT = "\ufffd"  # what a byte that is no UTF-8 was decoded as


def test_a_conversation_id_that_is_not_utf8_is_refused_not_read_as_another(local_server: LiveServer) -> None:
    auth = local_server.auth("paid")
    with httpx.Client(base_url=local_server.base_url, timeout=30, headers=auth) as client:
        ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        stored = client.post(CHAT, json=ask | {"conversation_id": REPLACEMENT})
        assert stored.status_code == 200, stored.text
        # Its own name, percent-encoded as UTF-8, reads it (the edge's own writes come first).
        named = client.get("/v1/conversations/%EF%BF%BD/messages")
        assert named.status_code == 200, named.text
        assert named.json()["conversation_id"] == REPLACEMENT and named.json()["data"]

        for path in ("/v1/conversations/%FF/messages", "/v1/conversations/a%C0%AF/messages"):
            refused = client.get(path)
            assert refused.status_code == 400, (path, refused.text)
            error = refused.json()["error"]
            assert error["type"] == "invalid_request_error", error
            assert (error["param"], error["code"]) == ("conversation_id", "invalid_value"), error
