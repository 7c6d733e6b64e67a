"""floodgate_requests_rejected_total by tier: a mixed run's refusals counted under the tier of the
key that was refused, as each client was answered.

Without the tier a free tier's 429s (its limits at work) and a paid tier's (a page: paying users
turned away) were one series: the operator could not tell which tier was refused, though every
`chat_refused` line named it. A request refused before its key was read counts under "".

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
# The free tier takes one request per window; its second is the limiter's 429.
SETTINGS = {"tiers": {"paid": ROOMY_TIERS["paid"], "free": ROOMY_TIERS["free"] | {"requests_per_window": 1}}}

Key = tuple[str, str, str]  # tier, status, code


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, SETTINGS) as live:
        yield live


def _rejected(edge: LiveServer) -> Counter[Key]:
    counts: Counter[Key] = Counter()
    for family in text_string_to_metric_families(edge.metrics_text()):
        for sample in family.samples:
            if sample.name == "floodgate_requests_rejected_total":
                labels = sample.labels
                counts[(labels.get("tier", "?"), labels["status"], labels["code"])] += int(sample.value)
    return counts


def test_each_refusal_is_counted_under_the_tier_its_client_was_refused_in(edge: LiveServer) -> None:
    before = _rejected(edge)
    answered: Counter[Key] = Counter()
    sends = [
        ("free", OK),  # served
        ("free", OK),  # the free tier's request limit: 429
        ("free", OK | {"max_tokens": 10**6}),  # past the tier's max_tokens: 400
        ("paid", OK | {"max_tokens": 10**6}),
        ("paid", OK | {"model": "no-such-model"}),  # 404
        ("paid", OK),  # served
        (None, OK),  # a key nobody holds: 401, no tier known
    ]
    with httpx.Client(base_url=edge.base_url, timeout=60.0) as client:
        for who, body in sends:
            headers = edge.auth(who) if who else {"Authorization": "Bearer sk-nobody"}
            answer = client.post(CHAT, json=body, headers=headers)
            if answer.status_code != 200:
                error = answer.json()["error"]
                answered[(who or "", str(answer.status_code), error["code"] or error["type"])] += 1
    assert answered[("free", "429", "rate_limit_exceeded")] == 1, answered
    assert sum(answered.values()) == 5, answered
    counted = _rejected(edge) - before
    assert counted == answered
