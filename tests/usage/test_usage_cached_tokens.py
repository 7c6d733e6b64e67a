"""input_cached_tokens: of a row's input tokens, those the replica served from its prefix cache, as
OpenAI's usage API reports them beside input_tokens. Each completion reports its own
(usage.prompt_tokens_details.cached_tokens); /v1/usage, the admin read and `floodgate usage` said
none, so a user comparing the bill with the replies could not reconcile the cached tokens."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import itertools
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.cli import main
from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from edge.usage.record import Usage
from edge.usage.sqlite import SQLiteUsageStore
from edge.usage.store import UsageStore, WriteId
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, events
from tests.support.live_server import LiveServer, start_server

ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# Long enough to fill several KV blocks, so the second request finds some of them cached.
SYSTEM = "You answer questions about rivers, lakes and the sea, briefly and kindly. " * 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"tiers": ROOMY_TIERS, "keys": {"admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path_factory.mktemp("usage_cached"), settings) as live:
        yield live


def _complete(server: LiveServer, system: str, stream: bool) -> dict[str, Any]:
    """One request of the long prompt, run to its end: the usage object it reports."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Where do rivers start?"},
        ],
        "max_tokens": 4,
        "stream": stream,
    }
    if not stream:
        done = httpx.post(server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=60)
        assert done.status_code == 200, done.text
        usage: dict[str, Any] = done.json()["usage"]
        return usage
    body["stream_options"] = {"include_usage": True}
    with httpx.stream(
        "POST", server.base_url + CHAT, json=body, headers=server.auth("paid"), timeout=60
    ) as r:
        assert r.status_code == 200
        [usage] = [e["usage"] for e in events(r) if isinstance(e, dict) and e.get("usage")]
    return usage


def _sums(rows: list[dict[str, Any]], user: str) -> tuple[int, int, int]:
    mine = [r for r in rows if r["user"] == user]
    return (
        sum(int(r["input_tokens"]) for r in mine),
        sum(int(r["input_cached_tokens"]) for r in mine),
        sum(int(r["requests"]) for r in mine),
    )


def _usage_cli(server: LiveServer, tmp_path: Path) -> list[dict[str, str]]:
    """`floodgate usage --csv` on the edge's own store, as an operator runs it beside the edge."""
    config = tmp_path / "floodgate.toml"
    config.write_text(f'[keys]\nsqlite_path = "{server.settings.keys.sqlite_path}"\n')
    return list(csv.DictReader(io.StringIO(_run_cli(config))))


def _run_cli(config: Path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["usage", "--user", "paid-user", "--csv", "--config", str(config)]) == 0
    return out.getvalue()


def test_usage_counts_the_prompt_tokens_the_completions_said_were_cached(
    server: LiveServer, tmp_path: Path
) -> None:
    reads = {
        "own": lambda: httpx.get(server.base_url + "/v1/usage", headers=server.auth("paid"), timeout=30),
        "admin": lambda: httpx.get(
            server.base_url + "/v1/admin/usage", params={"limit": 1000}, headers=ADMIN, timeout=30
        ),
    }

    def read_all() -> dict[str, tuple[int, int, int]]:
        found = {}
        for name, read in reads.items():
            answer = read()
            assert answer.status_code == 200, answer.text
            found[name] = _sums(answer.json()["data"], "paid-user")
        found["cli"] = _sums(_usage_cli(server, tmp_path), "paid-user")
        return found

    before = read_all()
    system = f"{uuid.uuid4().hex} {SYSTEM}"
    first = _complete(server, system, stream=False)
    second = _complete(server, system, stream=True)
    # The same long prompt again: the replica served some of it from its prefix cache.
    assert second["prompt_tokens_details"]["cached_tokens"] > 0
    prompt = first["prompt_tokens"] + second["prompt_tokens"]
    cached = (
        first["prompt_tokens_details"]["cached_tokens"] + second["prompt_tokens_details"]["cached_tokens"]
    )
    after = read_all()
    for name in reads.keys() | {"cli"}:
        was, now = before[name], after[name]
        assert (now[0] - was[0], now[1] - was[1], now[2] - was[2]) == (prompt, cached, 2), name


@pytest.mark.anyio
async def test_cached_tokens_add_up_per_row(usage_store: UsageStore) -> None:
    writes = (WriteId("w", seq) for seq in itertools.count(1))
    await usage_store.add(Usage("cy", "m", "2026-01-01", 100, 5, 1, 64), next(writes))
    await usage_store.add(Usage("cy", "m", "2026-01-01", 100, 5, 1, 32), next(writes))
    await usage_store.add(Usage("cy", "m", "2026-01-02", 40, 1, 1), next(writes))
    expected = [Usage("cy", "m", "2026-01-01", 200, 10, 2, 96), Usage("cy", "m", "2026-01-02", 40, 1, 1, 0)]
    assert await usage_store.query("cy") == expected
    assert (await usage_store.page("cy", "", "", None, 10)).rows == expected


def test_a_usage_file_made_before_the_count_opens_and_reads_zero(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    with sqlite3.connect(path) as old:
        # The table as the previous release made it: no input_cached_tokens.
        old.executescript(
            """
            CREATE TABLE usage (
                user TEXT NOT NULL, day TEXT NOT NULL, model TEXT NOT NULL,
                input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, requests INTEGER NOT NULL,
                PRIMARY KEY (user, day, model)
            ) WITHOUT ROWID;
            INSERT INTO usage VALUES ('ann', '2026-01-01', 'm', 12, 30, 2);
            """
        )
    old.close()

    async def reopen() -> list[Usage]:
        store = SQLiteUsageStore(path)
        try:
            assert await store.query("ann") == [Usage("ann", "m", "2026-01-01", 12, 30, 2, 0)]
            await store.add(Usage("ann", "m", "2026-01-01", 20, 1, 1, 16), WriteId("w", 1))
            return await store.query("ann")
        finally:
            await store.aclose()

    assert asyncio.run(reopen()) == [Usage("ann", "m", "2026-01-01", 32, 31, 3, 16)]
