"""A model's token weight: its tokens count `token_weight` times against the user's token limit
(shared across models), while usage records stay in real tokens."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from edge.models.token_weight import WeightedLimiter, weighted
from limiter.factory import create_limiter
from limiter.memory import MemoryLimiter
from tests.edge.sse_client import CHAT, wait_until
from tests.limiter.tiers import tier as limits
from tests.models.conftest import LARGE, SMALL, TWO_MODELS
from tests.support.live_server import LiveServer, start_server

HI = [{"role": "user", "content": "hi"}]


def test_weighted_rounds_up_on_the_total() -> None:
    assert weighted(3, 1.1) == 4 and weighted(10, 1.1) == 11 and weighted(0, 2.0) == 0


@pytest.mark.anyio
async def test_a_request_at_a_fractional_weight_costs_its_whole_count_rounded_once() -> None:
    """17 prompt and 3 reply tokens at weight 1.5 come to 30 weighted tokens: rounded apart they
    cost 26 + 5 = 31 (a review: the budget fell by 31 for 20 tokens)."""
    limiter = MemoryLimiter()
    tier = limits(tokens=1_000, token_window_s=86_400, max_tokens=100)
    admission = await WeightedLimiter(limiter, 1.5).admit("fractional-user", "req-1", tier, 17, 3)
    assert admission.lease is not None
    assert await admission.lease.take(3) == 3
    await admission.lease.settle()
    after = (await limiter.admit("fractional-user", "req-2", tier, 0, 0)).decision
    assert after.remaining_tokens == 1_000 - 30


@pytest.mark.anyio
async def test_a_weighted_lease_charges_redis_weight_times_and_stops_at_the_budget(redis_url: str) -> None:
    """Budget 30 at weight 2: the 5-token prompt costs 10; of 14 output tokens only 10 fit (20)."""
    limiter = create_limiter("redis", redis_url, 1000, 1)
    tier = limits(
        requests=100, request_window_s=3600, tokens=30, token_window_s=3600, concurrent=4, max_tokens=100
    )
    try:
        heavy = WeightedLimiter(limiter, 2.0)
        admission = await heavy.admit("weighted-user", "req-1", tier, 5, 100)
        assert admission.decision.allowed and admission.lease is not None
        assert admission.decision.remaining_tokens == 30 - 10 - 20  # prompt 10 + initial lease 20
        lease = admission.lease
        assert await lease.take(7) == 7
        assert await lease.take(7) == 3  # 6 weighted tokens left pay for 3 whole ones
        assert await lease.take(1) == 0
        await lease.settle()
        # Nothing left for anyone of this user, on any model: the next request is refused on tokens.
        again = await limiter.admit("weighted-user", "req-2", tier, 1, 1)
        assert not again.decision.allowed and again.decision.limit == "tokens"
    finally:
        await limiter.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(("budget", "prompt", "delivered"), [(7, 2, 2), (10, 1, 5), (16, 4, 6)])
async def test_a_budget_ending_inside_a_token_costs_only_the_tokens_delivered_rounded_once(
    redis_url: str, budget: int, prompt: int, delivered: int
) -> None:
    """At weight 1.5 the budget's last weighted token pays for half a token, which is never
    delivered: it stayed charged, and Redis recorded one weighted token more than
    ceil((prompt + delivered) * 1.5) (budget 7, prompt 2, 2 delivered: 7 spent for 6)."""
    limiter = create_limiter("redis", redis_url, 1000, 1)
    tier = limits(
        requests=100,
        request_window_s=3600,
        tokens=budget,
        token_window_s=10_000_000,
        concurrent=4,
        max_tokens=100,
    )
    user = f"part-token-{budget}-{prompt}"
    try:
        admission = await WeightedLimiter(limiter, 1.5).admit(user, "req-1", tier, prompt, 100)
        assert admission.lease is not None
        taken = [await admission.lease.take(1) for _ in range(delivered + 1)]
        assert taken == [1] * delivered + [0]  # the budget's end
        await admission.lease.settle()
        after = (await limiter.admit(user, "req-2", tier, 0, 0)).decision
        assert budget - after.remaining_tokens == weighted(prompt + delivered, 1.5) == budget - 1
    finally:
        await limiter.aclose()


@pytest.fixture(scope="module")
def redis_edge(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[LiveServer]:
    """Both models open to the free tier, limits in one Redis."""
    tiers = {name: dict(tier) for name, tier in TWO_MODELS["tiers"].items()}
    # A small budget over a very long window: its refill (0.0001 token/s) cannot blur the count.
    tiers["free"] |= {"models": [SMALL, LARGE], "tokens_per_window": 1000, "token_window_s": 10_000_000}
    overrides = TWO_MODELS | {"tiers": tiers, "limiter": {"backend": "redis", "redis_url": redis_url}}
    with start_server(tmp_path_factory.mktemp("weighted-edge"), overrides) as live:
        yield live


def _ask(server: LiveServer, who: str, model: str) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "messages": HI, "max_tokens": 4, "temperature": 0.0}
    answer = httpx.post(server.base_url + CHAT, json=body, headers=server.auth(who), timeout=60.0)
    assert answer.status_code == 200, answer.text
    return answer


def test_the_edge_charges_the_large_models_tokens_twice_and_records_them_once(redis_edge: LiveServer) -> None:
    """Two free users send the same greedy request, one to `large` (weight 2), one to `small`; then
    the same probe to `small`. The probe's remaining tokens differ by exactly one more charge of
    the first request's real tokens. Each user's usage shows the real tokens."""
    heavy, light = _ask(redis_edge, "free", LARGE).json(), _ask(redis_edge, "free2", SMALL).json()
    assert heavy["choices"][0]["finish_reason"] == light["choices"][0]["finish_reason"] == "length"
    assert heavy["usage"] == light["usage"]
    real = heavy["usage"]["prompt_tokens"] + heavy["usage"]["completion_tokens"]
    probe_heavy = _ask(redis_edge, "free", SMALL).headers
    probe_light = _ask(redis_edge, "free2", SMALL).headers
    left_heavy = int(probe_heavy["x-ratelimit-remaining-tokens"])
    left_light = int(probe_light["x-ratelimit-remaining-tokens"])
    assert left_light - left_heavy == real

    usage_url = redis_edge.base_url + "/v1/usage"

    def large_row() -> dict[str, Any] | None:
        rows = httpx.get(usage_url, headers=redis_edge.auth("free")).json()["data"]
        return next((row for row in rows if row["model"] == LARGE), None)

    # Written off the request path: poll until the row is there.
    wait_until(lambda: large_row() is not None, what="the large model's usage row")
    row = large_row()
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (
        heavy["usage"]["prompt_tokens"],
        heavy["usage"]["completion_tokens"],
    )


def test_a_prompt_over_the_whole_budget_at_its_models_weight_says_what_it_counts_as(
    redis_edge: LiveServer,
) -> None:
    """The message compared real tokens with the weighted budget: 600 tokens "more than" a budget
    of 1,000 read as a wrong sum. It now says what the prompt counts as on this model."""
    body = {"model": LARGE, "messages": [{"role": "user", "content": "word " * 560}], "max_tokens": 1}
    refused = httpx.post(redis_edge.base_url + CHAT, json=body, headers=redis_edge.auth("free"), timeout=60.0)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "tokens_exceed_budget"
    real, counted = (int(n) for n in re.findall(r"(\d+) tokens", error["message"])[:2])
    assert 500 < real <= 1000 < counted == 2 * real, error["message"]
