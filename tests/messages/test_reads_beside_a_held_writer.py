"""A history read on SQLite while another connection holds the file's write lock (another edge
worker, `floodgate keys`, an operator's `sqlite3` shell mid-transaction): WAL lets a reader read
beside a writer, so the read answers with what is stored, at once.

It waited behind this edge's own writes to the file instead (a conversation lock's take, a turn's
append), each of which waits out SQLite's 5 s busy wait on the one connection the store had: a
history reload took 5 to 16 s for a conversation whose turns were all stored."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx

from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import start_server

HISTORY = "/v1/conversations/{}/messages"
# Far below SQLite's 5 s busy wait, which the read waited out at least once; far above a read's
# milliseconds on a loaded machine.
PROMPT_READ_S = 1.5


def test_a_history_read_does_not_wait_behind_writes_another_writer_holds_up(tmp_path: Path) -> None:
    with (
        start_server(tmp_path) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        paid = server.auth("paid")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert client.post(CHAT, json=body | {"conversation_id": "kept"}, headers=paid).status_code == 200
        stored = client.get(HISTORY.format("kept"), headers=paid)  # waits for its own turns
        assert [m["role"] for m in stored.json()["data"]] == ["user", "assistant"]

        held = sqlite3.connect(server.settings.messages.sqlite_path, isolation_level=None)
        held.execute("BEGIN IMMEDIATE")  # no other connection writes until it ends
        try:
            # Its lock's take is a write: the edge goes on unlocked after half a second, while the
            # take waits out the busy wait on a store thread, and its turns queue behind it.
            other = client.post(CHAT, json=body | {"conversation_id": "other"}, headers=paid)
            assert other.status_code == 200
            started = time.monotonic()
            during = client.get(HISTORY.format("kept"), headers=paid)
            took = time.monotonic() - started
        finally:
            held.execute("ROLLBACK")
            held.close()
    assert during.status_code == 200, during.text
    assert during.json()["data"] == stored.json()["data"]
    assert took < PROMPT_READ_S, f"the read waited {took:.2f} s behind writes"
