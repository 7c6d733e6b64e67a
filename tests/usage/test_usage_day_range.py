"""The days of a usage read, at their bounds, on a real server: both bounds take their own day, and
a start after the end (the two swapped) is a 400 naming `start`, on the user's read and the admin's.
Before, the swapped bounds answered 200 with an empty list, which reads as no usage at all (`floodgate
usage` already refused them, exit 2, for that reason)."""

from __future__ import annotations

import datetime
from pathlib import Path

import httpx

from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import start_server

ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_day_range_takes_both_bounds_and_refuses_them_swapped(tmp_path: Path) -> None:
    settings = {"tiers": ROOMY_TIERS, "keys": {"admin_key_sha256": hash_key(ADMIN_KEY)}}
    with start_server(tmp_path, settings) as server, httpx.Client(timeout=60) as client:
        done = client.post(server.base_url + CHAT, json=ASK, headers=server.auth("paid"))
        assert done.status_code == 200, done.text
        # The row's day, as the server stamped it (a read of today could straddle midnight).
        own = client.get(server.base_url + "/v1/usage", headers=server.auth("paid")).json()["data"]
        assert len(own) == 1, own
        day = datetime.date.fromisoformat(own[0]["date"])
        before, after = (
            (day - datetime.timedelta(days=1)).isoformat(),
            (day + datetime.timedelta(days=1)).isoformat(),
        )

        reads = [
            (server.base_url + "/v1/usage", server.auth("paid"), {}),
            (server.base_url + "/v1/admin/usage", ADMIN, {"user": "paid-user"}),
        ]
        for url, headers, query in reads:
            # Both bounds are the row's own day: it is in.
            same = client.get(
                url, params=query | {"start": day.isoformat(), "end": day.isoformat()}, headers=headers
            )
            assert same.status_code == 200 and [r["date"] for r in same.json()["data"]] == [day.isoformat()]
            # Either bound a day past it: out.
            for bounds in ({"start": after}, {"end": before}):
                outside = client.get(url, params=query | bounds, headers=headers)
                assert outside.status_code == 200 and outside.json()["data"] == [], (bounds, outside.text)
            # Swapped, around the row's day: no day is named, which the client must be told.
            for start, end in ((after, before), (day.isoformat(), before), (after, day.isoformat())):
                swapped = client.get(url, params=query | {"start": start, "end": end}, headers=headers)
                assert swapped.status_code == 400, (url, start, end, swapped.text)
                error = swapped.json()["error"]
                assert error["param"] == "start" and error["type"] == "invalid_request_error"
                assert start in error["message"] and end in error["message"]
