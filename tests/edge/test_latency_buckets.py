"""The latency histograms a served edge exposes reach past the longest a request may wait.

A request waits in the queue up to its tier's max_queue_wait_s (the shipped paid tier: 120 s) and
its first token comes after that wait and its prefill. The time-to-first-token histogram ended at
60 s: in an overload, when an operator reads it, every paid request past a minute fell in +Inf, and
histogram_quantile answered 60 s for a p99 of two minutes. The queue wait's ended at 120 s, the
paid tier's bound itself, which a wait granted as its timer fires passes.

On the shipped tiers (edge/defaults.toml), not the suite's roomy ones."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import start_server


def _largest_bound(text: str, histogram: str) -> float:
    bounds = [
        float(sample.labels["le"])
        for family in text_string_to_metric_families(text)
        if family.name == histogram
        for sample in family.samples
        if sample.name == histogram + "_bucket"
    ]
    assert bounds, f"{histogram} has no buckets"
    return max(b for b in bounds if not math.isinf(b))


def test_ttft_and_queue_wait_buckets_reach_past_every_tiers_longest_wait(tmp_path: Path) -> None:
    with start_server(tmp_path) as edge:
        answer = httpx.post(
            edge.base_url + CHAT,
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers=edge.auth("paid"),
            timeout=60.0,
        )
        assert answer.status_code == 200, answer.text
        longest_wait = max(tier.max_queue_wait_s for tier in edge.settings.tiers.values())
        text = edge.metrics_text()
    assert longest_wait >= 120.0  # the shipped paid tier's, which this test is about
    assert _largest_bound(text, "floodgate_time_to_first_token_seconds") > longest_wait
    assert _largest_bound(text, "floodgate_queue_wait_seconds") > longest_wait


def test_inter_token_buckets_reach_past_the_longest_stall_a_stream_survives(tmp_path: Path) -> None:
    """A stream whose engine sends nothing for up to [engine] stall_timeout_s goes on (past it the
    engine is killed and its streams fail): a gap between two tokens that long is one the edge
    serves, from a preemption, a prefill joining, a restart's replay or a slow Triton step. The
    buckets ended at 1.28 s, so every stall fell in +Inf and histogram_quantile could not tell a
    p99 stall of 2 s from one of 2 minutes."""
    with start_server(tmp_path) as edge:
        answer = httpx.post(
            edge.base_url + CHAT,
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "stream": True,
            },
            headers=edge.auth("paid"),
            timeout=60.0,
        )
        assert answer.status_code == 200, answer.text
        longest_stall = edge.settings.engine.stall_timeout_s
        text = edge.metrics_text()
    assert _largest_bound(text, "floodgate_inter_token_latency_seconds") > longest_stall
