"""A running edge with `[metrics] cloudwatch = true` publishes the scaling metric (moto server)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from edge.scaling import metric
from tests.scaling.conftest import read_back
from tests.support.live_server import start_server
from tests.support.moto_server import REGION


def test_a_running_edge_publishes_demand_per_replica(
    tmp_path: Path, moto_endpoint: str, cloudwatch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # boto3's own configuration points the edge's default client at moto.
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    model = f"model-{uuid.uuid4().hex[:8]}"
    overrides = {
        "model": {"name": model},
        "metrics": {"cloudwatch": True, "cloudwatch_region": REGION, "cloudwatch_interval_s": 0.1},
    }
    with start_server(tmp_path, overrides):
        deadline = time.monotonic() + 20
        # Nothing to wait on but CloudWatch itself: poll it, bounded.
        while not (published := read_back(cloudwatch, model, "SampleCount")):
            assert time.monotonic() < deadline, "the edge published nothing"
            time.sleep(0.05)
        # An idle edge: nothing in flight, waiting or turned away.
        assert read_back(cloudwatch, model, "Maximum") == [0.0]
        assert read_back(cloudwatch, model, "Maximum", metric.REPLICA_LOAD_METRIC) == [0.0]
    assert published[0] >= 1
    listed = cloudwatch.list_metrics(Namespace=metric.NAMESPACE, MetricName=metric.DEMAND_METRIC)
    assert {"Name": metric.MODEL_DIMENSION, "Value": model} in [
        d for m in listed["Metrics"] for d in m["Dimensions"]
    ]
