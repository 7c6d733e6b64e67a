"""A request no replica could ever hold, however long it waited, is refused at once with a 400 that
names the limit (as vLLM answers a prompt longer than its model holds), not a 503 no_replica whose
"try again in 1s" a client would obey forever beside an idle replica. Judged on every replica's
whole size and the tier's part of it, never on what the replicas hold now, nor on this edge's share
of replicas the fleet divides (that share grows when edges leave:
tests/membership/test_edge_servers.py keeps its 503); on a share nothing changes, the in-memory
limiter's instance_count, it is (tests/edge/test_instance_share.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from edge.config import Settings
from edge.upstreams.base import Upstream
from tests.admission.replicas import ControlledUpstream
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, wait_until
from tests.support.live_server import start_server

# 8 blocks of 16: one engine holds 128 KV tokens, the free tiers 102 of them (reserve 0.2).
SMALL_POOL = {"block_size": 16, "num_blocks": 8}


def _chat(server: Any, tier: str, max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        return client.post(CHAT, json=body, headers=server.auth(tier))


def _assert_never_fits(answer: httpx.Response, *, code: str, says: str) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    assert says in error["message"], error["message"]
    assert "retry-after" not in answer.headers


def test_a_free_request_past_the_free_share_of_an_idle_engine_is_a_400(tmp_path: Path) -> None:
    """Within the model's context (128) but past the free share of the only engine's KV cache
    (102): a 503 no_replica on every retry before."""
    overrides = {"tiers": ROOMY_TIERS, "engine": SMALL_POOL | {"isolation": "thread"}}
    with start_server(tmp_path, overrides) as server:
        free = _chat(server, "free", 80)
        _assert_never_fits(free, code="context_length_exceeded", says="the free tier may use at most 96")
        prompt = _chat(server, "paid", 80).json()["usage"]["prompt_tokens"]
        split = f"needs {prompt + 80} tokens of KV cache ({prompt} in the messages, 80 in the completion)"
        assert split in free.json()["error"]["message"]
        # What does fit the free share is served as before.
        assert _chat(server, "free", 40).status_code == 200


def test_a_free_request_where_the_reserve_leaves_free_tiers_no_sequence_is_a_400(tmp_path: Path) -> None:
    """One sequence per engine, 20 % of it reserved for paid work: free tiers may run none, ever."""
    engine = SMALL_POOL | {"max_num_seqs": 1, "isolation": "thread"}
    with start_server(tmp_path, {"tiers": ROOMY_TIERS, "engine": engine}) as server:
        _assert_never_fits(_chat(server, "free", 4), code="tier_not_served", says="no sequence")
        assert _chat(server, "paid", 4).status_code == 200


def _serving(*replicas: Upstream) -> Any:
    def provider(settings: Settings, model_dir: Path) -> Any:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            yield list(replicas)

        return provide()

    return provider


def test_a_request_a_replica_of_unknown_size_could_hold_is_not_a_400(tmp_path: Path) -> None:
    """A larger replica not up yet (loading its engine, or down since before this edge started: it
    never answered a check) beside a smaller one that is up: a request past the small one could be
    the large one's as soon as it answers. A 400 tells the client to shorten it for good (a chat
    client trims its history); it waits, and is served once the large replica is up."""
    small = ControlledUpstream("small", kv_tokens_total=64, max_sequences=8, kv_block_tokens=16)
    large = ControlledUpstream("large", kv_tokens_total=1024, max_sequences=8, kv_block_tokens=16)
    large.is_ready = False
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}, _serving(small, large)) as server:
        answer = _chat(server, "paid", 100)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "no_replica"
        large.is_ready = True
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        wait_until(
            lambda: any(r.name == "large" and r.alive for r in dispatcher.replicas.members),
            what="the large replica's first passing check",
        )
        assert _chat(server, "paid", 100).status_code == 200


def test_a_replica_reporting_no_kv_cache_yet_refuses_nothing_for_good(tmp_path: Path) -> None:
    """A replica up but whose size reads 0 (a Triton host's TensorRT-LLM gauges not exported, or not
    filled in yet: edge/upstreams/triton.py reads a missing gauge as 0) has said nothing of its
    size: a 400 "a replica holds at most 0" for every request was the edge's misreading."""
    blank = ControlledUpstream("blank", kv_tokens_total=0, max_sequences=0)
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}, _serving(blank)) as server:
        for tier in ("paid", "free"):
            answer = _chat(server, tier, 4)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "no_replica"


def test_a_paid_request_larger_than_every_replica_is_a_400(tmp_path: Path) -> None:
    """A replica smaller than the model's context (a Triton host built with less KV cache than
    --max-seq-len): what no replica holds whole is refused for paid tiers too."""
    small = ControlledUpstream("small", kv_tokens_total=64, max_sequences=8, kv_block_tokens=16)
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}, _serving(small)) as server:
        _assert_never_fits(
            _chat(server, "paid", 100), code="context_length_exceeded", says="a replica holds at most 64"
        )
        assert _chat(server, "paid", 4).status_code == 200


def test_a_queued_request_a_replica_stops_fitting_is_answered_the_400(tmp_path: Path) -> None:
    """A request waiting for the one replica that could hold it (restarting, expected back within
    the tier's wait), which comes back smaller: no replica could ever hold it now. It failed 503
    no_replica, and only its retry got the 400 naming the limit; it gets the 400 itself."""
    small = ControlledUpstream("small", kv_tokens_total=64, max_sequences=8, kv_block_tokens=16)
    large = ControlledUpstream("large", kv_tokens_total=1024, max_sequences=8, kv_block_tokens=16)
    with (
        start_server(tmp_path, {"tiers": ROOMY_TIERS}, _serving(small, large)) as server,
        ThreadPoolExecutor(1) as pool,
    ):
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        large.is_ready, large.restart_eta_s = False, 30.0
        wait_until(
            lambda: any(r.name == "large" and not r.alive for r in dispatcher.replicas.members),
            what="the large replica's restart to be seen",
        )
        waiting = pool.submit(_chat, server, "paid", 100)
        wait_until(lambda: dispatcher.queue_depth() == 1, what="the request to queue for the large replica")
        # Back, with the small one's size.
        large.kv_tokens_total, large.is_ready, large.restart_eta_s = 64, True, None
        _assert_never_fits(
            waiting.result(timeout=30), code="context_length_exceeded", says="a replica holds at most 64"
        )
