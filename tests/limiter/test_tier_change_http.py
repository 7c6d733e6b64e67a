"""A key moved to another tier, as its user sees it, on the in-process limiter and on Redis alike:
each tier the user is in has its own budgets (limiter/tiers.py, TierLimits.name), so an upgrade is
not throttled by what the free tier spent, and a move back finds that tier's budget as it was left,
not refilled."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
SLACK = 8  # the budget's rounding, and the tokens one step can add to a reply cut by it
ASK: dict[str, Any] = {"model": MODEL, "messages": LONG_PROMPT, "temperature": 0}


class Mover:
    """A key of its own on a live edge, and the admin API that moves it between tiers."""

    def __init__(self, client: httpx.Client, user: str, tier: str) -> None:
        self._client = client
        made = client.post("/v1/admin/keys", json={"user": user, "tier": tier}, headers=ADMIN)
        assert made.status_code in (200, 201), made.text
        self._id = made.json()["id"]
        self._auth = {"Authorization": f"Bearer {made.json()['key']}"}

    def move_to(self, tier: str) -> None:
        moved = self._client.post(f"/v1/admin/keys/{self._id}/tier", json={"tier": tier}, headers=ADMIN)
        assert moved.status_code == 200, moved.text

    def ask(self, max_tokens: int) -> httpx.Response:
        return self._client.post(CHAT, json=ASK | {"max_tokens": max_tokens}, headers=self._auth)


@contextmanager
def edge(tmp_path: Path, backend: str, redis_server: RedisServer) -> Iterator[httpx.Client]:
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
    with start_server(tmp_path, settings) as server, httpx.Client(base_url=server.base_url) as client:
        yield client


def spent(response: httpx.Response) -> int:
    usage = response.json()["usage"]
    return int(usage["prompt_tokens"] + usage["completion_tokens"])


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_free_key_that_spent_its_day_moved_to_paid_has_the_paid_budget(
    tmp_path: Path, backend: str, redis_server: RedisServer
) -> None:
    with edge(tmp_path, backend, redis_server) as client:
        mover = Mover(client, f"upgrader-{backend}", "free")
        whole_day = mover.ask(1000)  # the reply stops when the free budget is gone
        assert whole_day.status_code == 200, whole_day.text
        assert whole_day.json()["choices"][0]["finish_reason"] == "length"
        assert mover.ask(4).status_code == 429
        mover.move_to("paid")
        upgraded = mover.ask(4)
    assert upgraded.status_code == 200, upgraded.text
    assert upgraded.headers["x-ratelimit-limit-tokens"] == str(PAID_TOKENS)
    remaining = int(upgraded.headers["x-ratelimit-remaining-tokens"])
    # One budget across tiers read the free day's time owed as a whole paid day spent: a 429, or a
    # few dozen tokens left.
    assert abs(remaining - (PAID_TOKENS - spent(upgraded))) <= SLACK


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_paid_key_moved_to_free_and_back_finds_its_paid_budget_as_it_left_it(
    tmp_path: Path, backend: str, redis_server: RedisServer
) -> None:
    with edge(tmp_path, backend, redis_server) as client:
        mover = Mover(client, f"mover-{backend}", "paid")
        on_paid = mover.ask(40)
        assert on_paid.status_code == 200, on_paid.text
        mover.move_to("free")
        on_free = mover.ask(4)
        assert on_free.status_code == 200, on_free.text
        assert (
            abs(int(on_free.headers["x-ratelimit-remaining-tokens"]) - (FREE_TOKENS - spent(on_free)))
            <= SLACK
        )
        mover.move_to("paid")
        back = mover.ask(4)
    assert back.status_code == 200, back.text
    remaining = int(back.headers["x-ratelimit-remaining-tokens"])
    # Neither refilled (the whole paid budget again) nor charged the free request at paid's rate.
    assert abs(remaining - (PAID_TOKENS - spent(on_paid) - spent(back))) <= SLACK
