"""A DynamoDB connection gone silent (a host lost mid-failover, a black-holed path) must not stop
the conversation history: the writer's call gives up on it within seconds and the retry opens a
new connection. With botocore's defaults (60 s a reply, then retries) every later turn of every
conversation queued behind that one call, and a shutdown meanwhile dropped them all."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from tests.edge.sse_client import CHAT, MODEL, wait_until
from tests.support.live_server import start_server
from tests.support.stalling_proxy import StallingProxy
from tests.support.tcp_proxy import running

# Past the store's read timeout and one retry, well short of botocore's default 60 s.
HISTORY_WITHIN_S = 20.0


def test_turns_after_the_stores_connection_went_silent_are_stored(
    tmp_path: Path, dynalite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    port = int(dynalite_endpoint.rsplit(":", 1)[1])
    table = f"floodgate-silent-{uuid.uuid4().hex[:8]}"
    with running(StallingProxy(port)) as proxy:
        messages = {
            "backend": "dynamodb",
            "dynamodb_endpoint": f"http://127.0.0.1:{proxy.port}",
            "dynamodb_table": table,
        }
        with (
            start_server(tmp_path, {"messages": messages}) as server,
            httpx.Client(base_url=server.base_url, timeout=30) as client,
        ):

            def turn(conversation: str) -> None:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"q {conversation}"}],
                    "max_tokens": 4,
                    "conversation_id": conversation,
                }
                assert client.post(CHAT, json=body, headers=server.auth("paid")).status_code == 200

            def stored(conversation: str) -> bool:
                got = client.get(f"/v1/conversations/{conversation}/messages", headers=server.auth("paid"))
                return got.status_code == 200 and len(got.json()["data"]) == 2

            turn("before")
            wait_until(lambda: stored("before"), HISTORY_WITHIN_S, "the first turn stored")
            proxy.stall()  # the connection the store holds goes silent; new ones still work
            after = [f"after-{i}" for i in range(5)]
            for conversation in after:
                turn(conversation)
            wait_until(lambda: all(stored(c) for c in after), HISTORY_WITHIN_S, "the later turns stored")
