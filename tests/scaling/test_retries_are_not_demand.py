"""With no GPU replica up (a scale from zero), clients that retry the edge's 503 no_replica as told
ask for the same work again: the published demand is the distinct requests, not their tries.

A real edge on loopback reads an empty Auto Scaling group and publishes to CloudWatch, both in moto;
the clients are the official OpenAI SDK and this project's client, at their default retries.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from edge.scaling import metric
from floodgate_client import Client, ServiceUnavailableError
from tests.scaling.conftest import read_back
from tests.support.live_server import LiveServer, start_server
from tests.support.moto_server import REGION, gpu_group

CLIENTS = 6
# Priced so that a request asks for exactly one replica-second (no prompt cost): a period's Sum of
# DemandPerReplica x the sample interval is then the number of requests counted.
PRICE = {"prefill_s_per_token": 0.0, "decode_s_per_token": 0.01, "mean_reply_tokens": 100.0}
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def empty_group(moto_endpoint: str) -> Iterator[str]:
    name = f"floodgate-gpu-empty-{uuid.uuid4().hex[:8]}"
    with gpu_group(moto_endpoint, name, desired=0):
        yield name


def _sdk_asks(server: LiveServer, model: str) -> None:
    # The SDK's defaults: two retries, after the edge's retry-after-ms.
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.keys["paid"]) as sdk:
        with pytest.raises(openai.InternalServerError) as refused:
            sdk.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.status_code == 503
    assert refused.value.response.json()["error"]["code"] == "no_replica"


def _client_asks(server: LiveServer, model: str) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        with pytest.raises(ServiceUnavailableError, match="No model replica"):
            client.chat.create(MESSAGES, model=model, max_tokens=4, auto_retry=True)


@pytest.mark.parametrize("asks", [_sdk_asks, _client_asks], ids=["openai-sdk", "floodgate-client"])
def test_clients_retrying_a_scale_from_zero_count_once_each(
    tmp_path: Path,
    moto_endpoint: str,
    cloudwatch: Any,
    empty_group: str,
    monkeypatch: pytest.MonkeyPatch,
    asks: Callable[[LiveServer, str], None],
) -> None:
    # boto3's own configuration points the edge's clients (Auto Scaling, EC2, CloudWatch) at moto.
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    model = f"model-{uuid.uuid4().hex[:8]}"
    overrides = {
        "model": {"name": model},
        "upstream": {"triton": f"asg:{empty_group}", "region": REGION},
        "metrics": {"cloudwatch": True, "cloudwatch_region": REGION, "cloudwatch_interval_s": 0.1, **PRICE},
    }
    # No replica up: /readyz says "unavailable" (the load balancer sends to every edge then).
    with start_server(tmp_path, overrides, ready_when=("unavailable",)) as server:
        with ThreadPoolExecutor(CLIENTS) as pool:
            for done in [pool.submit(asks, server, model) for _ in range(CLIENTS)]:
                done.result()
        tries = server.app.state.runtime.pipeline.dispatcher.turned_away()
    # Stopped: the publisher sent what it had sampled, every try included.
    (published,) = read_back(cloudwatch, model, "Sum")
    assert tries == CLIENTS * 3  # each client was refused, and retried twice, as told
    assert published * metric.SAMPLE_INTERVAL_S == pytest.approx(CLIENTS)
