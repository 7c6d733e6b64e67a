"""Rotating the admin key without downtime: several admin key hashes open /v1/admin/* at once, so
the new key is added, every operator tool moved to it, then the old one removed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from tests.support.live_server import LiveServer, start_server

OLD_KEY = new_secret(ADMIN_KEY_PREFIX)
NEW_KEY = new_secret(ADMIN_KEY_PREFIX)


def _status(server: LiveServer, key: str) -> int:
    response = httpx.get(server.base_url + "/v1/admin/keys", headers={"Authorization": f"Bearer {key}"})
    return response.status_code


@pytest.fixture(scope="module")
def rotating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # Upper case as `sha256sum | tr a-f A-F` or a hex viewer may write it: a hash is a hash.
    hashes = [hash_key(OLD_KEY), hash_key(NEW_KEY).upper()]
    with start_server(tmp_path_factory.mktemp("rotating"), {"keys": {"admin_key_sha256": hashes}}) as live:
        yield live


def test_both_keys_of_a_rotation_open_the_admin_api(rotating: LiveServer) -> None:
    assert _status(rotating, OLD_KEY) == 200
    assert _status(rotating, NEW_KEY) == 200


def test_a_key_of_neither_hash_is_refused(rotating: LiveServer) -> None:
    response = httpx.get(
        rotating.base_url + "/v1/admin/keys",
        headers={"Authorization": f"Bearer {new_secret(ADMIN_KEY_PREFIX)}"},
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_one_hash_as_a_string_still_opens_the_admin_api(tmp_path: Path) -> None:
    with start_server(tmp_path, {"keys": {"admin_key_sha256": hash_key(OLD_KEY)}}) as live:
        assert _status(live, OLD_KEY) == 200
        assert _status(live, NEW_KEY) == 401


def test_an_empty_list_leaves_the_admin_api_off(tmp_path: Path) -> None:
    with start_server(tmp_path, {"keys": {"admin_key_sha256": []}}) as live:
        assert _status(live, OLD_KEY) == 404
