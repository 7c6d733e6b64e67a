"""An edge serving two models counts each model's requests apart on its /metrics page: tokens,
outcomes, time to first token and queue wait carry the model beside the tier, as the queue's depth
already did, so a dashboard can tell which model is slow or busy.

On an edge of its own, serving models of names no other test uses: every server a test process
starts shares one Prometheus registry, and the package's shared edge may still be finishing another
test's streams, which would count too. So every count under these names is this test's."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge.keys.provision import create_keys
from tests.edge.sse_client import CHAT
from tests.models.conftest import TWO_MODELS
from tests.support.live_server import LiveServer, start_server
from tests.support.raw_http import read_to_close

SMALL, LARGE = "tally-small", "tally-large"
# TWO_MODELS (tests/models/conftest.py) with its models renamed.
OWN_MODELS: dict[str, Any] = TWO_MODELS | {
    "models": {SMALL: TWO_MODELS["models"]["small"], LARGE: TWO_MODELS["models"]["large"]},
    "tiers": {
        "free": TWO_MODELS["tiers"]["free"] | {"models": [SMALL], "default_model": SMALL},
        "paid": TWO_MODELS["tiers"]["paid"] | {"models": [LARGE, SMALL], "default_model": LARGE},
    },
}


@pytest.fixture
def own_edge(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path, OWN_MODELS) as live:
        yield live


def test_each_models_tokens_outcomes_and_latencies_are_counted_under_its_own_name(
    own_edge: LiveServer,
) -> None:
    usage: dict[str, dict[str, int]] = {}
    for model, max_tokens in ((SMALL, 3), (LARGE, 5)):
        answer = httpx.post(
            own_edge.base_url + CHAT,
            # Past the end token: a short reply sampled at the default temperature may otherwise stop
            # before max_tokens (finish_reason stop, once in a fresh-clone CI run), not the length
            # this test counts.
            json={
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
            headers=own_edge.auth("paid"),
            timeout=60.0,
        )
        assert answer.status_code == 200, answer.text
        usage[model] = answer.json()["usage"]
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(own_edge.metrics_text())
        for sample in family.samples
    }

    def count(name: str, **labels: str) -> float:
        return samples.get((name, frozenset(labels.items())), 0.0)

    for model in (SMALL, LARGE):
        mine = {"model": model, "tier": "paid"}
        assert count("floodgate_prompt_tokens_total", **mine) == usage[model]["prompt_tokens"]
        assert count("floodgate_generation_tokens_total", **mine) == usage[model]["completion_tokens"]
        assert count("floodgate_requests_finished_total", **mine, reason="length") == 1
        assert count("floodgate_time_to_first_token_seconds_count", **mine) == 1
        assert count("floodgate_queue_wait_seconds_count", **mine) == 1
    # Told apart, not only both counted: each model's reply had its own length.
    assert usage[SMALL]["completion_tokens"] == 3 and usage[LARGE]["completion_tokens"] == 5


def _rejected(live: LiveServer) -> dict[frozenset[tuple[str, str]], float]:
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(live.metrics_text())
        for sample in family.samples
        if sample.name == "floodgate_requests_rejected_total"
    }


def test_each_models_refusals_are_counted_under_its_own_name(own_edge: LiveServer) -> None:
    """floodgate_requests_rejected_total had no model: an operator serving several could not tell
    whose requests were refused. A configured model's own name where the request reached one (named,
    or its tier's default); a fixed "" otherwise, so that a client naming models at random cannot
    make a series of each."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}
    cases = [
        ("paid", chat | {"model": SMALL}, SMALL),
        ("paid", chat | {"model": ""}, LARGE),  # empty: the tier's default
        ("free", chat | {"model": ""}, SMALL),
        ("paid", chat, LARGE),  # no model at all: the tier's default, as empty
        ("paid", chat | {"model": "no-such-model-3f9a"}, ""),
        ("free", chat | {"model": LARGE}, ""),  # not the tier's: answered as unknown
    ]
    for who, body, model in cases:
        before = _rejected(own_edge)
        answer = httpx.post(own_edge.base_url + CHAT, json=body, headers=own_edge.auth(who), timeout=60.0)
        assert answer.status_code in (400, 404), answer.text
        error = answer.json()["error"]
        mine = frozenset(
            {
                "status": str(answer.status_code),
                "code": error["code"] or error["type"],
                "model": model,
                "tier": who,
            }.items()
        )
        after = _rejected(own_edge)
        grown = {labels: after[labels] - before.get(labels, 0.0) for labels in after}
        assert {labels: n for labels, n in grown.items() if n} == {mine: 1.0}, (body, grown)
    # A request the HTTP layer refuses has no model at all.
    before = _rejected(own_edge)
    with socket.create_connection(("127.0.0.1", own_edge.settings.server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n")
        assert read_to_close(sock).startswith(b"HTTP/1.1 400 ")
    protocol = frozenset({"status": "400", "code": "invalid_http_request", "model": "", "tier": ""}.items())
    assert _rejected(own_edge)[protocol] == before.get(protocol, 0.0) + 1
    # No series under the name a client made up.
    assert not any(("model", "no-such-model-3f9a") in labels for labels in _rejected(own_edge))


def test_a_request_of_an_unconfigured_tier_is_counted_under_no_model_and_no_tier(
    own_edge: LiveServer,
) -> None:
    """A key whose tier the settings no longer name (a tier renamed or removed, its keys left): its
    403 unknown_tier was counted under the first configured model, a model it never reached (its
    tier has none), so that model's refusals rose with requests none of its users sent."""
    settings = own_edge.settings
    with_gold = msgspec.structs.replace(settings, tiers={**settings.tiers, "gold": settings.tiers["paid"]})
    gold = create_keys(with_gold, {"gold": ("gold-user", "gold")})["gold"]
    before = _rejected(own_edge)
    answer = httpx.post(
        own_edge.base_url + CHAT,
        json={"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        headers={"Authorization": f"Bearer {gold}"},
        timeout=60.0,
    )
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "unknown_tier", answer.text
    after = _rejected(own_edge)
    grown = {labels: after[labels] - before.get(labels, 0.0) for labels in after}
    # Nor under its tier's name: a series per tier the key store holds, not per configured one.
    mine = frozenset({"status": "403", "code": "unknown_tier", "model": "", "tier": ""}.items())
    assert {labels: n for labels, n in grown.items() if n} == {mine: 1.0}, grown
