"""Several edge instances in front of the same replicas: each fills only its share of a replica."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.edge.sse_client import CHAT, MODEL
from tests.support.live_server import start_server

# 8 blocks of 16: a replica holds 128 KV tokens, so a request of about 100 fits one whole replica
# but not half of one.
SMALL_ENGINE = {"engine": {"block_size": 16, "num_blocks": 8}}
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 80}


@pytest.mark.parametrize(("instances", "status"), [(1, 200), (2, 503)])
def test_each_instance_fills_only_its_share_of_a_replica(tmp_path: Path, instances: int, status: int) -> None:
    overrides = SMALL_ENGINE | {"limiter": {"instance_count": instances}}
    with start_server(tmp_path, overrides) as server, httpx.Client(base_url=server.base_url) as client:
        answer = client.post(CHAT, json=BODY, headers=server.auth("paid"))
    assert answer.status_code == status
    if status == 503:
        assert answer.json()["error"]["code"] == "no_replica"
