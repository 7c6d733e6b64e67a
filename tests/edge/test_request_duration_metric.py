"""A served edge's /metrics has each admitted request's whole duration, and its counters' known
series from the start.

`floodgate_e2e_request_latency_seconds` (vLLM's `e2e_request_latency_seconds`, by model, tier and
the reason of floodgate_requests_finished_total): observed once per request as it ends, on every
path: streamed, not streamed, cancelled, disconnected, refused by the queue after admission. The
edge had a time to the first token and the gaps between tokens, and nothing of how long a request
took whole.

A labelled counter's series appeared only at its first increment: before a tier's first failure
`rate(floodgate_requests_finished_total{reason="error"}[5m])` had no series (a dashboard's "no data"
in place of 0), and that first increment was lost to rate(), which needs a sample before it.

On an edge of its own, with tiers of names no other test uses: every server a test process starts
shares one Prometheus registry, so every count under these tiers is this test's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge.admission.ticket import OverloadReason
from edge.generation import EndReason
from limiter.base import LimitName
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, KEEPALIVE, MODEL, events, wait_until
from tests.support.held_engines import engines_held
from tests.support.live_server import LiveServer, start_server

TIMED, UNUSED = "timed-tier", "unused-tier"
# The queue turns a request of the timed tier away after this long waiting for the only slot.
QUEUE_WAIT_S = 1.0
OVERRIDES: dict[str, Any] = {
    # One replica, one sequence: a request held on it keeps the next one queued.
    "engine": {"replicas": 1, "max_num_seqs": 1},
    "tiers": {
        TIMED: ROOMY_TIERS["paid"] | {"max_queue_wait_s": QUEUE_WAIT_S},
        UNUSED: ROOMY_TIERS["paid"],
    },
}
HI = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
# Past the end token: the reply runs to max_tokens (finish_reason "length").
SHORT = HI | {"max_tokens": 3, "ignore_eos": True}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("timed"), OVERRIDES) as live:
        yield live


def _samples(edge: LiveServer) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(edge.metrics_text())
        for sample in family.samples
    }


def test_every_counter_series_the_settings_name_is_served_at_zero_before_any_request(
    edge: LiveServer,
) -> None:
    samples = _samples(edge)
    mine = {"model": "", "tier": UNUSED}

    def served(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    missing = [
        (name, labels)
        for name, labels in [
            *(("floodgate_requests_finished_total", mine | {"reason": r}) for r in get_args(EndReason)),
            *(("floodgate_rate_limited_total", mine | {"limit": limit}) for limit in get_args(LimitName)),
            ("floodgate_prompt_tokens_total", mine),
            ("floodgate_generation_tokens_total", mine),
            *(
                ("floodgate_queue_rejected_total", {"model": "", "reason": r})
                for r in get_args(OverloadReason)
            ),
        ]
        if served(name, **labels) is None
    ]
    assert missing == []
    assert served("floodgate_requests_finished_total", **mine, reason="error") == 0.0


def _labels(reason: str) -> frozenset[tuple[str, str]]:
    return frozenset({("model", ""), ("tier", TIMED), ("reason", reason)})


def _read_first_event(response: httpx.Response) -> tuple[str, Iterator[Any]]:
    stream = events(response)
    first = next(stream)
    assert first != KEEPALIVE
    return first["request_id"], stream


def test_each_requests_whole_duration_is_observed_once_as_it_ends_on_every_path(edge: LiveServer) -> None:
    auth = edge.auth(TIMED)
    streamed = SHORT | {"stream": True}
    with httpx.Client(base_url=edge.base_url, timeout=60.0, headers=auth) as client:
        # Served, streamed and not; the queue learns from them how soon a place frees, and so
        # takes the request below in to wait (by the prior of 5 s a place takes, it was a 429).
        with client.stream("POST", CHAT, json=streamed) as served:
            list(events(served))
        assert client.post(CHAT, json=SHORT).status_code == 200
        with engines_held(edge):
            with client.stream("POST", CHAT, json=streamed) as held:
                # Placed on the only slot, where the held engine keeps it.
                held_id, held_rest = _read_first_event(held)
                # Admitted, its stream open, and turned away by the queue once its wait is up.
                with client.stream("POST", CHAT, json=streamed) as refused:
                    refusal = [e for e in events(refused) if isinstance(e, dict) and "error" in e]
                assert [e["error"]["code"] for e in refusal] == ["wait_too_long"]
                assert client.post(f"{CHAT}/{held_id}/cancel").status_code == 200
                list(held_rest)
            with client.stream("POST", CHAT, json=streamed) as left:
                _read_first_event(left)
            # The edge sees the hang-up on its own time.
            disconnected = ("floodgate_requests_finished_total", _labels("disconnected"))
            wait_until(lambda: _samples(edge).get(disconnected) == 1.0, 30.0, "the hang-up's end")

    samples = _samples(edge)

    def value(name: str, reason: str) -> float:
        return samples.get((name, _labels(reason)), 0.0)

    expected = {"overloaded": 1.0, "cancelled": 1.0, "disconnected": 1.0, "length": 2.0}
    histogram = "floodgate_e2e_request_latency_seconds"
    for reason in get_args(EndReason):
        finished = value("floodgate_requests_finished_total", reason)
        assert finished == expected.get(reason, 0.0), reason
        assert value(histogram + "_count", reason) == finished, reason
    # From the request's arrival: the refused one waited its tier's whole queue wait first.
    assert value(histogram + "_sum", "overloaded") >= QUEUE_WAIT_S
    assert 0.0 < value(histogram + "_sum", "length") < 60.0
