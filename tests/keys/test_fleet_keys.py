"""Two edges on one key store: a key made through one works on the other, and a revoked key is
refused by both within the stated bound (at once over Redis pub/sub; within keys.cache_ttl_s
without Redis)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.cli import main
from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from tests.edge.conftest import ROOMY_TIERS
from tests.support.live_server import LiveServer, start_server
from tests.support.redis_server import start_redis

ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
# Far longer than the test: only the pub/sub announcement can make an edge see a change in time.
LONG_TTL_S = 3600.0
SHORT_TTL_S = 1.0
# Polling gives up this long after the bound: a refusal later than that fails the test.
POLL_MARGIN_S = 10.0


def _settings(store: dict[str, str], ttl_s: float, limiter: dict[str, Any]) -> dict[str, Any]:
    """`store`: the [keys] settings of the one store both edges use (SQLite file or DynamoDB table)."""
    return {
        "tiers": ROOMY_TIERS,
        "limiter": limiter,
        "keys": store | {"cache_ttl_s": ttl_s, "admin_key_sha256": hash_key(ADMIN_KEY)},
    }


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    server = start_redis()
    yield server.url
    server.stop()


def _two_edges(tmp_path: Path, overrides: dict[str, Any]) -> tuple[LiveServer, LiveServer]:
    a = start_server(tmp_path / "a", overrides)
    try:
        b = start_server(tmp_path / "b", overrides)
    except BaseException:
        a.stop()
        raise
    return a, b


def _status(edge: LiveServer, key: str) -> int:
    return httpx.get(edge.base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code


def _admin(edge: LiveServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def _answered_within(edges: tuple[LiveServer, ...], key: str, status: int, bound_s: float) -> list[int]:
    deadline = time.monotonic() + bound_s + POLL_MARGIN_S
    while True:
        statuses = [_status(e, key) for e in edges]
        if all(s == status for s in statuses) or time.monotonic() > deadline:
            return statuses
        time.sleep(0.05)  # polling: the change reaches the other edge on its own schedule


def _refused_within(edges: tuple[LiveServer, ...], key: str, bound_s: float) -> list[int]:
    return _answered_within(edges, key, 401, bound_s)


def _create_on(edge: LiveServer, user: str) -> dict[str, Any]:
    made = httpx.post(
        edge.base_url + "/v1/admin/keys", json={"user": user, "tier": "free"}, headers=_admin(edge)
    )
    assert made.status_code == 201, made.text
    body: dict[str, Any] = made.json()
    return body


def test_over_redis_a_revocation_reaches_the_other_edge_at_once(tmp_path: Path, redis_url: str) -> None:
    limiter = {"backend": "redis", "redis_url": redis_url, "instance_count": 2, "timeout_ms": 2000}
    store = {"sqlite_path": str(tmp_path / "keys.db")}
    a, b = _two_edges(tmp_path, _settings(store, LONG_TTL_S, limiter))
    try:
        made = _create_on(a, "dora")
        key = made["key"]
        assert [_status(a, key), _status(b, key)] == [200, 200]  # both edges now cache it as valid

        revoked = httpx.post(f"{a.base_url}/v1/admin/keys/{made['id']}/revoke", headers=_admin(a))
        assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
        # The cache TTL is an hour: only the announcement can explain a refusal within the poll.
        assert _refused_within((a, b), key, bound_s=0.0) == [401, 401]
    finally:
        a.stop()
        b.stop()


def test_without_redis_a_revocation_reaches_every_edge_within_the_cache_ttl(
    tmp_path: Path, backend: dict[str, str]
) -> None:
    """On SQLite and on DynamoDB (dynalite), the production store."""
    a, b = _two_edges(tmp_path, _settings(backend, SHORT_TTL_S, {"backend": "memory"}))
    try:
        made = _create_on(b, "erin")
        key = made["key"]
        assert [_status(a, key), _status(b, key)] == [200, 200]
        assert (
            httpx.post(f"{b.base_url}/v1/admin/keys/{made['id']}/revoke", headers=_admin(b)).status_code
            == 200
        )
        assert _refused_within((a, b), key, bound_s=SHORT_TTL_S) == [401, 401]
    finally:
        a.stop()
        b.stop()


def test_over_redis_a_key_the_cli_imports_works_on_a_running_edge_at_once(
    tmp_path: Path, redis_url: str
) -> None:
    """A review: `floodgate keys import` (and the import of `[server] keys_file` every key command
    makes) announced nothing, so an edge asked with the key before caches it as unknown and refused
    it for keys.cache_ttl_s after the import, as it does here (an hour)."""
    limiter = {"backend": "redis", "redis_url": redis_url, "instance_count": 1, "timeout_ms": 2000}
    store = {"sqlite_path": str(tmp_path / "keys.db")}
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[server]\nkeys_file = "{tmp_path / "cli-keys.jsonl"}"\n'
        f'[keys]\nsqlite_path = "{store["sqlite_path"]}"\n'
        f'[limiter]\nbackend = "redis"\nredis_url = "{redis_url}"\n'
    )
    imported, in_keys_file = "fg-a-key-the-cli-imports", "fg-a-key-in-the-clis-keys-file"
    exported = tmp_path / "exported.jsonl"
    for path, key in ((exported, imported), (tmp_path / "cli-keys.jsonl", in_keys_file)):
        path.write_text(json.dumps({"key_sha256": hash_key(key), "user": "fay", "tier": "free"}) + "\n")
    with start_server(
        tmp_path / "edge", _settings(store, LONG_TTL_S, limiter | {"instance_count": 1})
    ) as edge:
        # Asked before the import: refused, and cached as unknown for the hour. (The edge's start
        # imported its own keys file, not the CLI's.)
        assert [_status(edge, imported), _status(edge, in_keys_file)] == [401, 401]
        assert main(["keys", "import", str(exported), "--config", str(config)]) == 0
        assert _answered_within((edge,), imported, 200, bound_s=0.0) == [200]
        assert _answered_within((edge,), in_keys_file, 200, bound_s=0.0) == [200]
