"""A key moved to another tier, as its user sees it: what it spent stays spent, counted in the new
tier's budget, on the in-process limiter and on Redis alike (limiter/policy.py's `retier`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.keys.record import ADMIN_KEY_PREFIX, hash_key, new_secret
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, LONG_PROMPT, MODEL
from tests.limiter.conftest import RedisServer
from tests.support.live_server import start_server

ADMIN_KEY = new_secret(ADMIN_KEY_PREFIX)
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
FREE_TOKENS = 400
PAID_TOKENS = 100_000


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_free_key_that_spent_its_day_moved_to_paid_has_the_paid_budget_less_what_it_spent(
    tmp_path: Path, backend: str, redis_server: RedisServer
) -> None:
    day = {"token_window_s": 86400, "request_window_s": 86400}
    settings: dict[str, Any] = {
        "tiers": {
            "free": ROOMY_TIERS["free"] | day | {"tokens_per_window": FREE_TOKENS},
            "paid": ROOMY_TIERS["paid"] | day | {"tokens_per_window": PAID_TOKENS},
        },
        "keys": {"admin_key_sha256": hash_key(ADMIN_KEY)},
    }
    if backend == "redis":
        settings["limiter"] = {"backend": "redis", "redis_url": redis_server.url, "timeout_ms": 2000}
    ask = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 1000, "temperature": 0}
    with start_server(tmp_path, settings) as server, httpx.Client(base_url=server.base_url) as client:
        made = client.post("/v1/admin/keys", json={"user": f"mover-{backend}", "tier": "free"}, headers=ADMIN)
        auth = {"Authorization": f"Bearer {made.json()['key']}"}
        # Spend the free day: the reply stops when the budget is gone.
        spent = client.post(CHAT, json=ask, headers=auth)
        assert spent.status_code == 200, spent.text
        assert spent.json()["choices"][0]["finish_reason"] == "length"
        assert client.post(CHAT, json=ask, headers=auth).status_code == 429
        moved = client.post(f"/v1/admin/keys/{made.json()['id']}/tier", json={"tier": "paid"}, headers=ADMIN)
        assert moved.status_code == 200
        upgraded = client.post(CHAT, json=ask | {"max_tokens": 4}, headers=auth)
    assert upgraded.status_code == 200, upgraded.text
    assert upgraded.headers["x-ratelimit-limit-tokens"] == str(PAID_TOKENS)
    this_one = upgraded.json()["usage"]["prompt_tokens"] + 4
    remaining = int(upgraded.headers["x-ratelimit-remaining-tokens"])
    # Before: the free day's TAT read as a whole paid day spent (remaining a few dozen tokens).
    assert PAID_TOKENS - FREE_TOKENS - this_one - 8 <= remaining <= PAID_TOKENS - FREE_TOKENS - this_one + 8
