"""Prometheus metrics of the admission queue and the replicas behind it (default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from edge.metric_children import child

# `model`: each served model has its own queue (edge/models/); "" where the edge serves one.
QUEUE_DEPTH = Gauge("floodgate_queue_depth", "Requests waiting for a replica slot.", ["model", "tier"])
QUEUE_WAIT = Histogram(
    "floodgate_queue_wait_seconds",
    "Time from joining the queue to getting a replica slot.",
    ["tier"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120),
)
REPLICA_UTILISATION = Gauge(
    "floodgate_replica_kv_utilisation",
    "KV-cache tokens held by this edge's in-flight requests over its share of the replica's capacity.",
    ["replica"],
)
REJECTED = Counter(
    "floodgate_queue_rejected_total",
    "Requests the admission queue turned away (429), by reason.",
    ["reason"],
)
QUEUE_DEPTH_PER_REPLICA = Gauge(
    "floodgate_queue_depth_per_replica",
    "Waiting requests per healthy replica: the figure the GPU pool autoscales on.",
    ["model"],
)


def publish(
    depth_by_tier: dict[str, int],
    utilisation_by_replica: dict[str, float],
    depth_per_replica: float,
    model: str = "",
) -> None:
    """Set the gauges from the dispatcher's state after a dispatch pass."""
    for tier, depth in depth_by_tier.items():
        child(QUEUE_DEPTH, model, tier).set(depth)
    for replica, utilisation in utilisation_by_replica.items():
        child(REPLICA_UTILISATION, replica).set(utilisation)
    child(QUEUE_DEPTH_PER_REPLICA, model).set(depth_per_replica)
