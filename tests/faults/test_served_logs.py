"""A served edge as an operator finds it on the host: every log line one JSON object, the lines of
the libraries under it (uvicorn's, Litestar's, botocore's) too; its database files its own."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import httpx

from tests.edge.sse_client import wait_until
from tests.faults.serve_process import serve_process
from tests.support.live_server import demo_model_dir

WAIT_S = 20.0


def test_a_library_warning_in_a_served_edge_is_a_json_line(tmp_path: Path) -> None:
    """Litestar's default logging config put its own plain-text handler on the root logger when the
    app was made, so uvicorn's warnings (and Litestar's, botocore's) left the edge as plain text.

    Set up as `floodgate serve` does (its logging, then the app made from a real config: the order
    the fault needed); the warning is uvicorn's own logger's. No request from outside makes a
    library warn any more: a request the HTTP parser refuses, which did, now writes the edge's own
    request_refused line alone (ffafdf1)."""
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "demo"\nname = "floodgate-tiny"\ndemo_dir = "{demo_model_dir()}"\n'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\ndev_key = false\n'
        f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n'
        f'[messages]\nsqlite_path = "{tmp_path / "messages.db"}"\n'
    )
    script = (
        "import logging\n"
        "from edge.logging_setup import configure_logging\n"
        "from edge.config import load_settings\n"
        "configure_logging()\n"
        "from edge.app import create_app\n"
        f"create_app(load_settings({str(config)!r}))\n"
        "logging.getLogger('uvicorn.error').warning('a library warns')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT_S * 3, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [line for line in done.stdout.splitlines() if "a library warns" in line]
    record = json.loads(line)
    assert record["logger"] == "uvicorn.error" and record["level"] == "warning", record
    assert "a library warns" not in done.stderr


def test_a_served_edges_files_are_its_own(tmp_path: Path) -> None:
    """Under the usual umask (022) the keys, usage and message databases were world-readable:
    stored prompts and replies, and the key hashes, open to every account on the host."""
    old = os.umask(0o022)
    try:
        with serve_process(tmp_path, {}) as server:
            reply = httpx.post(
                f"{server.base_url}/v1/chat/completions",
                json={
                    "model": "floodgate-tiny",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                    "conversation_id": "c1",
                },
                headers=server.auth(),
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
            made = sorted(p for p in tmp_path.rglob("*.db*") if p.is_file())
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in made}
    finally:
        os.umask(old)
    assert any(name.endswith(".db") for name in modes), modes
    assert all(mode & 0o077 == 0 for mode in modes.values()), {n: oct(m) for n, m in modes.items()}


def test_a_served_edges_refusal_lines_name_the_callers_tier(tmp_path: Path) -> None:
    """A request refused after its key was read (its body a 400, its model a 404, its size a 413)
    wrote a request_refused line naming the user and not the tier, as the chat_refused and
    chat_completion lines of the same caller do: an operator filtering a tier's lines in the
    served edge's output missed every such refusal."""
    chat = "/v1/chat/completions"
    ok = {"model": "floodgate-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with serve_process(tmp_path, {"server": {"max_body_bytes": 4096, "drain_accept_s": 0.0}}) as server:
        with httpx.Client(base_url=server.base_url, headers=server.auth(), timeout=60) as client:
            ids = [
                client.post(chat, content=b"{").headers["x-request-id"],
                client.post(chat, json=ok | {"model": "no-such-model"}).headers["x-request-id"],
                client.post(chat, json=ok | {"padding": "x" * 5000}).headers["x-request-id"],
            ]
        server.proc.terminate()
        server.proc.wait(timeout=WAIT_S * 3)
        records = [json.loads(line) for line in server.output().splitlines()]
    refused = {r["request_id"]: r for r in records if r["event"] == "request_refused"}
    assert sorted(refused) == sorted(ids), records
    for line in refused.values():
        assert (line["user"], line["tier"]) == ("drill-user", "paid"), line


def test_a_served_edges_failed_message_writes_name_their_request(tmp_path: Path) -> None:
    """A conversation's turns are written by the message writer, a task of the edge's own: its
    `message_write_failed` error (the turns lost for good) named the conversation and the message
    and not the request that wrote them, which every line a request causes carries: an operator
    could not tell which answer's history was lost, nor find the user's report by its id."""
    body = {
        "model": "floodgate-tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "conversation_id": "c1",
    }
    with serve_process(tmp_path, {"server": {"drain_accept_s": 0.0}}) as server:
        # The store fails every write (as a store gone from under the edge does) and every retry.
        store = sqlite3.connect(tmp_path / "messages.db", isolation_level=None)
        store.execute("DROP TABLE messages")
        store.close()
        chat = f"{server.base_url}/v1/chat/completions"
        reply = httpx.post(chat, json=body, headers=server.auth(), timeout=60)
        assert reply.status_code == 200, reply.text
        wait_until(
            lambda: _metric(server.ops_url, "floodgate_messages_failed_total") == 2.0,
            timeout_s=WAIT_S,
            what="the question's and the reply's writes given up",
        )
        server.proc.terminate()
        server.proc.wait(timeout=WAIT_S * 3)
        records = [json.loads(line) for line in server.output().splitlines()]
    failed = [r for r in records if r["event"] == "message_write_failed"]
    assert len(failed) == 2, records
    for line in failed:
        assert line["request_id"] == reply.headers["x-request-id"], line


def _metric(ops_url: str, name: str) -> float:
    metrics = httpx.get(f"{ops_url}/metrics", timeout=WAIT_S).text
    match = re.search(rf"^{name} ([0-9.e+]+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0
