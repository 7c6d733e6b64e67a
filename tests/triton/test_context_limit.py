"""A Triton replica's own sequence limit (its engine's --max-seq-len; our CPU model's max_model_len),
which the edge's settings may not know: the replica says it in its model config, and the edge holds
requests to it as it does for its in-process engines. Past it TensorRT-LLM (and the CPU model that
follows it) cuts the reply short as if it had ended: the edge must refuse a max_tokens the replica
cannot hold (400 context_length_exceeded), give a request without one what the replica leaves it,
and call a reply the limit ended "length"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from edge.upstreams.base import GenerationRequest
from edge.upstreams.triton import TritonUpstream, end_token_ids
from gpu_container.engine.types import EngineConfig
from tests.edge.sse_client import CHAT, MODEL
from tests.support.failing_paths_proxy import failing_paths_proxy
from tests.support.live_server import start_server
from tests.support.triton_server import LocalTriton, own_local_triton

# Far below what the edge would assume for it (the demo checkpoint's 4,096 positions).
REPLICA_LIMIT = 128
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def short_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    config = EngineConfig(
        block_size=16, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=128, max_model_len=REPLICA_LIMIT
    )
    with own_local_triton(tmp_path_factory.mktemp("short-repository"), config) as triton:
        yield triton


def _edge_overrides(triton: LocalTriton) -> dict[str, object]:
    # Reached as a remote replica: nothing in the edge's settings says its limit.
    return {"upstream": {"triton": triton.spec}}


def test_a_max_tokens_past_the_replicas_limit_is_refused(tmp_path: Path, short_triton: LocalTriton) -> None:
    with (
        start_server(tmp_path, _edge_overrides(short_triton)) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 200, "ignore_eos": True}
        answer = client.post(CHAT, json=body, headers=server.auth("paid"))
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert f"maximum context length is {REPLICA_LIMIT} tokens" in error["message"]
        card = client.get(f"/v1/models/{MODEL}", headers=server.auth("paid")).json()
        assert card["max_model_len"] == REPLICA_LIMIT


def test_a_reply_without_max_tokens_gets_what_the_replica_leaves_and_ends_length(
    tmp_path: Path, short_triton: LocalTriton
) -> None:
    with (
        start_server(tmp_path, _edge_overrides(short_triton)) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        body = {"model": MODEL, "messages": MESSAGES, "ignore_eos": True}
        answer = client.post(CHAT, json=body, headers=server.auth("paid"))
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["total_tokens"] == REPLICA_LIMIT


@pytest.mark.anyio
async def test_a_reply_the_replicas_limit_ends_is_length(short_triton: LocalTriton) -> None:
    """The upstream alone, asked for more than the replica holds (a caller past the edge's check,
    or a replica that says no limit): the engine ends it at the limit, and that is "length"."""
    eos = end_token_ids(short_triton.model_dir)[0]
    process = short_triton.process
    upstream = TritonUpstream("triton-short", process.http_url, process.metrics_url, end_id=eos, pad_id=eos)
    try:
        assert await upstream.ready()
        await upstream.capacity()  # the dispatcher's first poll: the replica says its limit there
        request = GenerationRequest("past-the-limit", [11, 42, 7], 500, seed=1, ignore_eos=True)
        tokens = 0
        reason = None
        async for delta in upstream.generate(request):
            tokens += len(delta.token_ids)
            reason = delta.finish_reason
        assert tokens == REPLICA_LIMIT - 3
        assert reason == "length"
    finally:
        await upstream.aclose()


@pytest.mark.anyio
async def test_a_replica_keeps_its_limit_when_its_config_cannot_be_read_again(
    short_triton: LocalTriton,
) -> None:
    """A replica that failed a health check (a probe timed out under load) has its config read
    again once it is back; where that read fails too (under the same load), the limit it said
    before still holds: the read is retried, and until then the edge must not take the replica for
    one that says no limit (its context back at the settings' guess, a reply the engine cuts
    called "stop")."""
    process = short_triton.process
    with failing_paths_proxy(process.http_url) as proxy:
        upstream = TritonUpstream("triton-short", proxy.url, process.metrics_url, probe_timeout_s=10)
        try:
            assert await upstream.ready()
            assert (await upstream.capacity()).max_sequence_tokens == REPLICA_LIMIT
            proxy.failing["/v2/health/ready"] = 503
            assert not await upstream.ready()
            del proxy.failing["/v2/health/ready"]
            proxy.failing[f"/v2/models/{upstream.model_name}/config"] = 503
            assert await upstream.ready()
            assert (await upstream.capacity()).max_sequence_tokens == REPLICA_LIMIT
        finally:
            await upstream.aclose()


@pytest.mark.anyio
async def test_a_config_that_stays_unreadable_is_logged_once_not_every_poll(
    short_triton: LocalTriton,
) -> None:
    """A replica whose model config cannot be read (an API the operator restricted, a proxy in
    front refusing it) is asked again with every capacity poll, each second, for as long as it
    runs: one warning says so, not one per poll, which buried every other line; a read that then
    answers is logged again after a later failure."""
    process = short_triton.process
    with failing_paths_proxy(process.http_url) as proxy:
        upstream = TritonUpstream("triton-short", proxy.url, process.metrics_url, probe_timeout_s=10)
        config = f"/v2/models/{upstream.model_name}/config"
        proxy.failing[config] = 403
        try:
            with capture_logs() as logs:
                assert await upstream.ready()
                for _ in range(5):
                    assert (await upstream.capacity()).max_sequence_tokens == 0
                del proxy.failing[config]
                assert (await upstream.capacity()).max_sequence_tokens == REPLICA_LIMIT
                proxy.failing["/v2/health/ready"] = 503
                assert not await upstream.ready()
                del proxy.failing["/v2/health/ready"]
                proxy.failing[config] = 403
                assert await upstream.ready()
                assert (await upstream.capacity()).max_sequence_tokens == REPLICA_LIMIT
            unread = [e for e in logs if e["event"] == "triton_model_config_unread"]
            assert len(unread) == 2, unread
        finally:
            await upstream.aclose()
