"""Prometheus metrics of the admission queue and the replicas behind it (default registry)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prometheus_client import Counter, Gauge

from edge.loop_histogram import LabelledLoopHistogram

# `model`: each served model has its own queue (edge/models/); "" where the edge serves one.
QUEUE_DEPTH = Gauge("floodgate_queue_depth", "Requests waiting for a replica slot.", ["model", "tier"])
# Past the shipped paid tier's max_queue_wait_s (120 s): a bound equal to it, a wait granted as its
# timer fired fell in +Inf.
QUEUE_WAIT = LabelledLoopHistogram(
    "floodgate_queue_wait_seconds",
    "Time from joining the queue to getting a replica slot.",
    ["model", "tier"],
    (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300),
)
# `model` beside `replica`: a remote Triton replica's name is its address, whatever model it serves.
REPLICA_UTILISATION = Gauge(
    "floodgate_replica_kv_utilisation",
    "KV-cache tokens held by this edge's in-flight requests over its share of the replica's capacity.",
    ["model", "replica"],
)
REJECTED = Counter(
    "floodgate_queue_rejected_total",
    "Requests a model's admission queue turned away (429, or 503 no_replica), by reason.",
    ["model", "reason"],
)
QUEUE_DEPTH_PER_REPLICA = Gauge(
    "floodgate_queue_depth_per_replica",
    "Waiting requests per healthy replica (the GPU pool scales on CloudWatch's DemandPerReplica and"
    " ReplicaLoadPerReplica, edge/scaling/, not on this).",
    ["model"],
)


def watch_queue(model: str, depth_per_replica: Callable[[], float]) -> None:
    """The queue's depth per replica, read when Prometheus collects.

    Read at scrape time, not set after every dispatch pass: setting the gauges cost every request
    two passes' worth of label look-ups and dict building (about 6 % of a one-token stream's CPU,
    docs/bench-streams.md), for values read every few seconds."""
    QUEUE_DEPTH_PER_REPLICA.labels(model).set_function(depth_per_replica)


def watch_tier(model: str, tier: str, depth: Callable[[], int]) -> None:
    """One tier's queue depth, read when Prometheus collects."""
    QUEUE_DEPTH.labels(model, tier).set_function(depth)


def watch_replica(model: str, replica: str, utilisation: Callable[[], float]) -> None:
    """A member replica's KV utilisation, read when Prometheus collects (until `forget_replica`)."""
    REPLICA_UTILISATION.labels(model, replica).set_function(utilisation)


def forget_replica(model: str, replica: str) -> None:
    with contextlib.suppress(KeyError):
        REPLICA_UTILISATION.remove(model, replica)
