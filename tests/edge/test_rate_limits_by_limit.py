"""floodgate_rate_limited_total: the limiter's 429s by the limit that refused them.

Every limiter refusal reaches floodgate_requests_rejected_total as code `rate_limit_exceeded`, the
code the client gets whichever limit it hit (OpenAI's shape: the limit is the error's type). A
free tier turned away for its request count, for its token budget and for its concurrency were one
series: the operator could not tell users spending their budget from a limit set too tight, though
every client was told which.

On an edge of its own, counted as differences: every server a test process starts shares one
Prometheus registry."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import LiveServer, start_server

OK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
# Free: one request per window. Paid: a token budget one request (17 prompt tokens, 2 reply
# tokens) leaves too little of for a second's prompt.
TOKENS = 30
SETTINGS = {
    "tiers": {
        "free": ROOMY_TIERS["free"] | {"requests_per_window": 1},
        "paid": ROOMY_TIERS["paid"] | {"tokens_per_window": TOKENS},
    }
}

Key = tuple[str, str]  # tier, limit


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, SETTINGS) as live:
        yield live


def _rate_limited(edge: LiveServer) -> Counter[Key]:
    counts: Counter[Key] = Counter()
    for family in text_string_to_metric_families(edge.metrics_text()):
        for sample in family.samples:
            if sample.name == "floodgate_rate_limited_total":
                counts[(sample.labels["tier"], sample.labels["limit"])] += int(sample.value)
    return counts


def test_each_limiter_refusal_is_counted_under_the_limit_its_client_was_told(edge: LiveServer) -> None:
    before = _rate_limited(edge)
    told: Counter[Key] = Counter()
    sends = [
        ("free", OK),  # served
        ("free", OK),  # the request count: 429 requests
        ("paid", OK),  # served
        ("paid", OK),  # the token budget: 429 tokens
    ]
    with httpx.Client(base_url=edge.base_url, timeout=60.0) as client:
        for who, body in sends:
            answer = client.post(CHAT, json=body, headers=edge.auth(who))
            if answer.status_code == 429:
                error = answer.json()["error"]
                assert error["code"] == "rate_limit_exceeded", error
                told[(who, error["type"])] += 1
    assert told == {("free", "requests"): 1, ("paid", "tokens"): 1}

    assert _rate_limited(edge) - before == told
