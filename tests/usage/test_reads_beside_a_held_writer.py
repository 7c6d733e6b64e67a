"""GET /v1/usage on SQLite while another connection holds the file's write lock (another edge
worker, `floodgate keys`, an operator's `sqlite3` shell mid-transaction): WAL lets a reader read
beside a writer, so the read answers with what is stored once its wait for this edge's unwritten
usage of its user (`[keys] usage_read_wait_s`) is over.

It waited behind this edge's own usage write instead, which waits out SQLite's 10 s busy wait on the
one connection the store had: the read took 10 s and more."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx

from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import start_server

USAGE_READ_WAIT_S = 1.0
# Far below SQLite's 10 s busy wait, which the read waited out; far above a read's milliseconds
# on a loaded machine.
PROMPT_READ_S = 1.5


def test_a_usage_read_does_not_wait_behind_a_write_another_writer_holds_up(tmp_path: Path) -> None:
    with (
        start_server(tmp_path, {"keys": {"usage_read_wait_s": USAGE_READ_WAIT_S}}) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        paid = server.auth("paid")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert client.post(CHAT, json=body, headers=paid).status_code == 200
        stored = client.get("/v1/usage", headers=paid)  # waits for its own usage
        assert stored.json()["data"][0]["requests"] == 1

        held = sqlite3.connect(server.settings.keys.sqlite_path, isolation_level=None)
        held.execute("BEGIN IMMEDIATE")  # no other connection writes until it ends
        try:
            # Its usage is written a moment later, the write waiting out the busy wait on a store
            # thread; the read waits its usage_read_wait_s for it, then reads what is stored.
            assert client.post(CHAT, json=body, headers=paid).status_code == 200
            started = time.monotonic()
            during = client.get("/v1/usage", headers=paid)
            took = time.monotonic() - started
        finally:
            held.execute("ROLLBACK")
            held.close()
    assert during.status_code == 200, during.text
    assert during.json()["data"] == stored.json()["data"]
    assert took < USAGE_READ_WAIT_S + PROMPT_READ_S, f"the read took {took:.2f} s"
