"""An answer not streamed goes out once its reply is charged: its x-ratelimit-*-tokens headers say
the budget the user has left after it, as OpenAI's describe the state after the request. They said
the budget as the admission left it (the prompt and a first lease of 32 tokens charged): a reply
the token budget cut (`limit_reached`, the budget spent) was answered "31 tokens remaining", and a
client pacing itself by the header sent a request that could only be refused."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, LONG_PROMPT, MODEL
from tests.support.live_server import start_server

BUDGET = 80
# A window so long nothing refills within the test: the headers move only by what is charged.
NO_REFILL = {"tokens_per_window": BUDGET, "token_window_s": 1e9}
LONG = {"model": MODEL, "messages": LONG_PROMPT, "max_tokens": 1000, "ignore_eos": True}


def test_an_answer_the_budget_cut_says_no_tokens_remain(
    tmp_path: Path, limiter_settings: dict[str, str]
) -> None:
    settings = {"tiers": {"paid": ROOMY_TIERS["paid"] | NO_REFILL}, "limiter": limiter_settings}
    with start_server(tmp_path, settings) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            cut = client.post(CHAT, json=LONG)
            refused = client.post(CHAT, json=LONG | {"max_tokens": 1})
    assert cut.status_code == 200, cut.text
    answer = cut.json()
    assert answer.get("floodgate") == {"limit_reached": "tokens"}
    assert answer["usage"]["total_tokens"] == BUDGET
    assert cut.headers["x-ratelimit-remaining-tokens"] == "0"
    assert refused.status_code == 429  # what the header said


def test_an_answer_says_the_budget_its_whole_reply_left(
    tmp_path: Path, limiter_settings: dict[str, str]
) -> None:
    """Within its first lease or past it (leases extended by the store, the last one's unused part
    refunded): what the user has left once the whole reply is charged."""
    tier = ROOMY_TIERS["paid"] | NO_REFILL | {"tokens_per_window": 10_000}
    settings = {"tiers": {"paid": tier}, "limiter": limiter_settings}
    with start_server(tmp_path, settings) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            short = client.post(CHAT, json=LONG | {"max_tokens": 3})
            long = client.post(CHAT, json=LONG | {"max_tokens": 300})
    spent = 0
    for answer in (short, long):
        assert answer.status_code == 200, answer.text
        spent += answer.json()["usage"]["total_tokens"]
        assert answer.headers["x-ratelimit-remaining-tokens"] == str(10_000 - spent)
