"""A moto server (CloudWatch, Auto Scaling, EC2 in one process) on a loopback port."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from edge.scaling import metric
from tests.support.moto_server import aws_client, running_moto


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with running_moto() as endpoint:
        yield endpoint


class PutRecorder:
    """Hooks a real CloudWatch client's PutMetricData calls: their parameters, and an event per call."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.calls: list[dict[str, Any]] = []
        self.changed = threading.Condition()

    def client(self) -> Any:
        client = aws_client("cloudwatch", self.endpoint)
        client.meta.events.register("provide-client-params.cloudwatch.PutMetricData", self._record)
        return client

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        with self.changed:
            self.calls.append(params)
            self.changed.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.calls) >= count, timeout_s)


@pytest.fixture
def recorder(moto_endpoint: str) -> PutRecorder:
    return PutRecorder(moto_endpoint)


@pytest.fixture
def cloudwatch(moto_endpoint: str) -> Any:
    return aws_client("cloudwatch", moto_endpoint)


ClientFactory = Callable[[], Any]


def read_back(cloudwatch: Any, model: str, stat: str, name: str = metric.DEMAND_METRIC) -> list[float]:
    now = datetime.now(UTC)
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "q",
                "MetricStat": {
                    "Metric": {
                        "Namespace": metric.NAMESPACE,
                        "MetricName": name,
                        "Dimensions": [{"Name": metric.MODEL_DIMENSION, "Value": model}],
                    },
                    "Period": 3600,
                    "Stat": stat,
                },
            }
        ],
        # One bucket around now: every datum of the test falls in it.
        StartTime=now - timedelta(minutes=30),
        EndTime=now + timedelta(minutes=30),
    )
    return [float(v) for v in answer["MetricDataResults"][0]["Values"]]
