"""A usage page's `after` that names no row the store can hold is the client's mistake: a 400
naming it, on either store, never a store error (a 503 telling the client to retry it for good)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from tests.edge.conftest import ROOMY_TIERS
from tests.support.live_server import start_server

ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _row_id(user: str, day: str, model: str) -> str:
    raw = json.dumps([user, day, model], separators=(",", ":")).encode()
    return "usage_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    ("query", "cursor"),
    [
        # A model past what a row's sort key can hold (DynamoDB: 1,024 bytes with its day).
        ({"user": "alice"}, ("alice", "2026-01-01", "m" * 1100)),
        # A user past what a row's partition key can hold, over everyone's rows.
        ({}, ("u" * 2100, "2026-01-01", "m")),
    ],
)
def test_a_cursor_no_stored_row_can_have_is_a_400_naming_after(
    backend: dict[str, str], tmp_path: Path, query: dict[str, str], cursor: tuple[str, str, str]
) -> None:
    settings = {"tiers": ROOMY_TIERS, "keys": {**backend, "admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path, settings) as server:
        answer = httpx.get(
            server.base_url + "/v1/admin/usage", params={**query, "after": _row_id(*cursor)}, headers=ADMIN
        )
    if answer.status_code == 200:
        assert answer.json()["data"] == []  # SQLite holds any row: nothing of the table follows it
    else:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "after"


@pytest.mark.parametrize("field", [0, 1, 2])
def test_a_cursor_holding_a_lone_surrogate_is_a_400_naming_after(
    backend: dict[str, str], tmp_path: Path, field: int
) -> None:
    # JSON may spell a lone surrogate ("\ud800"), which no stored user, day or model is (each is
    # UTF-8): read from the cursor, it reached the store, whose encoding of it raised, a 500 with
    # an unhandled_error line for any key holder's GET /v1/usage.
    cursor = ["free-user", "2026-01-01", "m"]
    cursor[field] = "\ud800"
    settings = {"tiers": ROOMY_TIERS, "keys": {**backend, "admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path, settings) as server:
        params = {"after": _row_id(*cursor)}
        earlier = server.rejected(500)  # the process's metrics: an earlier test's 500 counts there
        answers = [
            httpx.get(server.base_url + "/v1/usage", params=params, headers=server.auth("free")),
            httpx.get(server.base_url + "/v1/admin/usage", params=params, headers=ADMIN),
        ]
        assert server.rejected(500) == earlier
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "after"
