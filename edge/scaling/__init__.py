"""The GPU pool's scaling signal: what it measures (demand.py), what a request costs (work.py), its
CloudWatch names (metric.py), and how the edge sends it (publisher.py). Terraform scales on exactly
this (iac/modules/gpu_pool)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edge.scaling import metric
from edge.scaling.demand import DemandSignal, DispatcherView
from edge.scaling.publisher import ScalingPublisher
from edge.scaling.work import WorkPrice, work_price

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient

__all__ = [
    "DemandSignal",
    "DispatcherView",
    "ScalingPublisher",
    "WorkPrice",
    "metric",
    "scaling_publisher",
    "work_price",
]


def scaling_publisher(
    model: str,
    dispatcher: DispatcherView,
    client_factory: Callable[[], CloudWatchClient],
    interval_s: float = metric.PERIOD_S,
    price: WorkPrice | None = None,
) -> ScalingPublisher:
    """The running edge's publisher: samples `dispatcher` every sample interval (or every
    `interval_s`, when shorter, as in tests) and sends them every `interval_s`; `price`: what a
    request costs a replica (work.py)."""
    return ScalingPublisher(
        DemandSignal(dispatcher, price, model=model).sample,
        dimensions=metric.dimensions(model),
        client_factory=client_factory,
        interval_s=interval_s,
        sample_interval_s=min(metric.SAMPLE_INTERVAL_S, interval_s),
    )
