"""A request that arrives before midnight (UTC) and ends after it is counted on the day it arrived:
the day of its reply's `created`, the one time the client is told. Stamped with the day it ended, a
stream started at 23:59:50 was billed on the next day, and a client summing its replies' `usage`
by their `created` day could match neither day's row of /v1/usage."""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, MODEL, events
from tests.support.held_engines import engines_held
from tests.support.live_server import start_server

ASK: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_a_request_spanning_midnight_is_counted_on_the_day_it_arrived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}) as server, httpx.Client(timeout=60) as client:
        with engines_held(server) as let_go:
            with client.stream("POST", server.base_url + CHAT, json=ASK, headers=server.auth("paid")) as r:
                assert r.status_code == 200
                got = events(r)
                created = next(got)["created"]  # admitted, its first token not made yet
                # Midnight passes while it runs: the clock now reads a day later.
                real = time.time
                monkeypatch.setattr(time, "time", lambda: real() + 86_400)
                let_go()
                rest = list(got)
        assert rest[-1] == DONE
        [usage] = [e["usage"] for e in rest if isinstance(e, dict) and e.get("usage")]
        rows = client.get(server.base_url + "/v1/usage", headers=server.auth("paid")).json()["data"]
    arrived = datetime.datetime.fromtimestamp(created, datetime.UTC).date().isoformat()
    assert [(r["date"], r["input_tokens"], r["output_tokens"], r["requests"]) for r in rows] == [
        (arrived, usage["prompt_tokens"], usage["completion_tokens"], 1)
    ]
