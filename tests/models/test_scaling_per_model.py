"""Each model's GPU group scales on its own demand: the edge publishes one DemandPerReplica series
per model (dimension Model), and a flood on one model raises only that model's series."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.scaling import metric
from gpu_container.engine.engine_process import EngineProcess
from tests.edge.sse_client import CHAT, wait_until
from tests.models.conftest import LARGE, SMALL, TWO_MODELS, replicas_of
from tests.support.live_server import start_server
from tests.support.moto_server import REGION, aws_client, running_moto

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with running_moto() as endpoint:
        yield endpoint


def _maximum(cloudwatch: Any, model: str) -> list[float]:
    now = datetime.now(UTC)
    stat = {
        "Metric": {
            "Namespace": metric.NAMESPACE,
            "MetricName": metric.DEMAND_METRIC,
            "Dimensions": [{"Name": metric.MODEL_DIMENSION, "Value": model}],
        },
        "Period": 3600,
        "Stat": "Maximum",
    }
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=[{"Id": "q", "MetricStat": stat}],
        StartTime=now - timedelta(minutes=30),
        EndTime=now + timedelta(minutes=30),
    )
    return [float(v) for v in answer["MetricDataResults"][0]["Values"]]


def test_a_flood_on_one_model_raises_only_its_own_demand(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    # Fresh model names: the moto server keeps what other tests published.
    small, large = f"{SMALL}-{uuid.uuid4().hex[:6]}", f"{LARGE}-{uuid.uuid4().hex[:6]}"
    models = TWO_MODELS["models"]
    tiers = {name: dict(tier) for name, tier in TWO_MODELS["tiers"].items()}
    tiers["free"] |= {"models": [small], "default_model": small}
    tiers["paid"] |= {"models": [large, small], "default_model": large}
    overrides = TWO_MODELS | {
        "models": {small: models[SMALL], large: models[LARGE]},
        "tiers": tiers,
        "metrics": {"cloudwatch": True, "cloudwatch_region": REGION, "cloudwatch_interval_s": 0.1},
    }
    cloudwatch = aws_client("cloudwatch", moto_endpoint)
    with start_server(tmp_path, overrides) as server:
        (engine,) = replicas_of(server, small)
        assert isinstance(engine, EngineProcess) and engine.pid is not None
        flood = {"model": small, "messages": HI, "max_tokens": 50, "stream": True}
        os.kill(engine.pid, signal.SIGSTOP)  # nothing on `small` finishes: its demand stays up
        try:
            with ExitStack() as streams, httpx.Client(base_url=server.base_url, timeout=60.0) as client:
                for _ in range(3):
                    streams.enter_context(
                        client.stream("POST", CHAT, json=flood, headers=server.auth("paid"))
                    )
                deadline = time.monotonic() + 20
                # Nothing to wait on but CloudWatch itself: poll it, bounded.
                while not any(v > 0 for v in _maximum(cloudwatch, small)):
                    assert time.monotonic() < deadline, "no demand published for the flooded model"
                    time.sleep(0.05)
                wait_until(lambda: bool(_maximum(cloudwatch, large)), what="the idle model's series")
                assert _maximum(cloudwatch, large) == [0.0]
                os.kill(engine.pid, signal.SIGCONT)
        finally:
            os.kill(engine.pid, signal.SIGCONT)
