"""A conversation's turns read back in the order they were said when consecutive turns are served
by different edges of a fleet (one store, on SQLite and on DynamoDB) whose clocks disagree: message
ids are made from each edge's clock, and an edge running behind made its question an id below the
reply it followed, so the history read another turn's question first."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.messages.ids import MessageIdGenerator
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.live_server import LiveServer, start_server

# Far past the time a turn takes, however loaded the machine: before the order was kept, every
# turn of the edge behind sorted before the turns it followed.
SKEW_MS = 5_000


@pytest.fixture
def fleet(
    store_endpoint: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Two edges on one store and one key store; the second's clock SKEW_MS behind the first's."""
    messages: dict[str, Any] = {"sqlite_path": str(tmp_path / "messages.db")}
    if store_endpoint is not None:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, "test")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        table = f"floodgate-order-{uuid.uuid4().hex[:8]}"
        messages = {"backend": "dynamodb", "dynamodb_endpoint": store_endpoint, "dynamodb_table": table}
    behind = MessageIdGenerator(clock_ms=lambda: time.time_ns() // 1_000_000 - SKEW_MS)
    with start_server(tmp_path, {"messages": messages}) as a:
        shared = {"keys": {"sqlite_path": a.settings.keys.sqlite_path}, "messages": messages}
        with start_server(tmp_path / "b", shared, message_ids=behind) as b:
            yield a, b


def test_turns_served_by_edges_whose_clocks_disagree_read_back_in_order(
    fleet: tuple[LiveServer, LiveServer],
) -> None:
    a, b = fleet
    conv = f"fleet-{uuid.uuid4().hex[:8]}"
    auth = a.auth("paid")
    with httpx.Client(timeout=60) as client:
        for turn in range(6):
            edge = (a, b)[turn % 2]  # the load balancer sends each turn elsewhere
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"question {turn}"}],
                "max_tokens": 4,
                "stream": turn % 3 != 2,  # the turns not streamed are stored with their answer
                "conversation_id": conv,
            }
            if body["stream"]:
                with client.stream("POST", edge.base_url + CHAT, json=body, headers=auth) as response:
                    assert response.status_code == 200
                    assert list(events(response))[-1] == DONE
            else:
                assert client.post(edge.base_url + CHAT, json=body, headers=auth).status_code == 200
        # A read waits for the turns its own edge has not yet written: asked of both, the second
        # finds every turn.
        url = f"/v1/conversations/{conv}/messages"
        assert client.get(a.base_url + url, headers=auth).status_code == 200
        page = client.get(b.base_url + url, headers=auth).json()
    said = [m["content"] if m["role"] == "user" else m["role"] for m in page["data"]]
    assert said == [x for turn in range(6) for x in (f"question {turn}", "assistant")]
    assert len({m["id"] for m in page["data"]}) == 12
