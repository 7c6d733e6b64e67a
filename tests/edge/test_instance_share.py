"""Several edge instances in front of the same replicas: each fills only its share of a replica
every instance reaches (a Triton host), and the whole of one it alone reaches (its own engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edge.upstreams.triton import triton_upstreams
from gpu_container.engine.types import EngineConfig
from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import start_server
from tests.support.triton_server import LocalTriton, own_local_triton

# 8 blocks of 16: a replica holds 128 KV tokens, so a request of about 100 fits one whole replica
# but not half of one.
SMALL_ENGINE = {"engine": {"block_size": 16, "num_blocks": 8}}
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 80}


@pytest.fixture(scope="module")
def small_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """A Triton host of the same size: a replica other instances could reach as well."""
    config = EngineConfig(block_size=16, num_blocks=8, max_num_seqs=4, max_num_batched_tokens=128)
    with own_local_triton(tmp_path_factory.mktemp("small-repository"), config) as triton:
        yield triton


@pytest.mark.parametrize(("instances", "status"), [(1, 200), (2, 400)])
def test_each_instance_fills_only_its_share_of_a_shared_replica(
    tmp_path: Path, small_triton: LocalTriton, instances: int, status: int
) -> None:
    """With the in-memory limiter the share is the static 1/instance_count, which never grows: a
    request past it is refused for good, so it is a 400 naming the limit (it was a 503 no_replica,
    whose Retry-After the client obeyed forever). Where the edges count themselves (the redis
    backend) the share grows as edges leave, and past it is a 503 for now
    (tests/admission/test_replicas.py)."""
    overrides = SMALL_ENGINE | {"limiter": {"instance_count": instances}}
    provider = triton_upstreams(small_triton.spec)
    with (
        start_server(tmp_path, overrides, provider) as server,
        httpx.Client(base_url=server.base_url) as client,
    ):
        answer = client.post(CHAT, json=BODY, headers=server.auth("paid"))
        if status == 400:
            # What does fit the share is served.
            assert (
                client.post(CHAT, json=BODY | {"max_tokens": 4}, headers=server.auth("paid")).status_code
                == 200
            )
    assert answer.status_code == status, answer.text
    if status == 400:
        error = answer.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert "this server's share of a replica holds at most 64" in error["message"], error["message"]
        assert "retry-after" not in answer.headers


def test_an_instance_fills_the_whole_of_its_own_engine(tmp_path: Path) -> None:
    """The local engine is this instance's own: no other instance sends it work, so however many
    instances there are, this one may fill all of it."""
    overrides = SMALL_ENGINE | {"limiter": {"instance_count": 2}}
    with start_server(tmp_path, overrides) as server, httpx.Client(base_url=server.base_url) as client:
        answer = client.post(CHAT, json=BODY, headers=server.auth("paid"))
    assert answer.status_code == 200, answer.text


def test_a_share_that_holds_no_sequence_says_so_to_a_paid_user(
    tmp_path: Path, small_triton: LocalTriton
) -> None:
    """Five in-memory instances in front of a replica of four sequences: this one's fixed share
    holds none, for any tier. A paid user was told that the paid reserve leaves the free tier no
    sequence, which is neither its tier nor the cause; the answer names this server's share."""
    overrides = SMALL_ENGINE | {"limiter": {"instance_count": 5}}
    provider = triton_upstreams(small_triton.spec)
    with (
        start_server(tmp_path, overrides, upstreams=provider) as server,
        httpx.Client(base_url=server.base_url) as client,
    ):
        answer = client.post(CHAT, json=BODY | {"max_tokens": 4}, headers=server.auth("paid"))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "tier_not_served"
    assert "free tier" not in error["message"] and "paid reserve" not in error["message"], error["message"]
    assert "server's share of the model replicas holds no sequence" in error["message"], error["message"]
