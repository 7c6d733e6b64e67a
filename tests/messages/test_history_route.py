"""GET /v1/conversations/{id}/messages on a real edge: a conversation id no URL can carry is a 400
naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer, start_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path) as live:
        yield live


@pytest.mark.parametrize("conversation_id", [".", ".."])
def test_a_conversation_id_no_url_can_carry_is_refused(server: LiveServer, conversation_id: str) -> None:
    """httpx and browsers resolve /v1/conversations/./messages before sending it: a conversation
    stored under "." or ".." could never be read back."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "conversation_id": conversation_id,
    }
    answer = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "conversation_id"
