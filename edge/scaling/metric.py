"""The scaling signal's CloudWatch names and sampling, defined once: the edge publishes them,
Terraform scales on them (iac/modules/scaling_metric; tests/iac fails if the two drift apart).

Two metrics per sample, both with the `Model` dimension:

* `DemandPerReplica`: one edge's demand over the sequences of the replicas it sees (demand.py).
  Each edge counts only its own requests, so the fleet's figure is the sum over the edges of one
  period's samples divided by `SAMPLES_PER_PERIOD`, whatever the number of edges.
* `ReplicaLoadPerReplica`: the replicas' own reported running + waiting sequences over their
  sequences. Every edge sees the same replicas, so the fleet's figure is the Maximum over them.

The policies track `MAX([demand / SAMPLES_PER_PERIOD, replica_load])`: 1.0 means every sequence of
every replica is wanted.
"""

from __future__ import annotations

from typing import Final

NAMESPACE: Final = "Floodgate"
DEMAND_METRIC: Final = "DemandPerReplica"
REPLICA_LOAD_METRIC: Final = "ReplicaLoadPerReplica"
MODEL_DIMENSION: Final = "Model"
UNIT: Final = "None"

SAMPLE_INTERVAL_S: Final = 10
PERIOD_S: Final = 60
SAMPLES_PER_PERIOD: Final = PERIOD_S // SAMPLE_INTERVAL_S


MAX_DIMENSION_VALUE: Final = 1024


def dimension_value_problem(value: str) -> str:
    """Why CloudWatch refuses `value` as a dimension's value, "" where it takes it (its API
    reference, Dimension: ASCII only, no control character, at least one non-whitespace character,
    1 to 1,024 characters). botocore checks only the length: the rest fails each PutMetricData."""
    if not value.isascii():
        return "CloudWatch takes a dimension value in ASCII only"
    if not value.isprintable():
        return "CloudWatch takes no control character in a dimension value"
    if not value.strip():
        return "CloudWatch needs a dimension value with something besides whitespace"
    if len(value) > MAX_DIMENSION_VALUE:
        return f"CloudWatch takes a dimension value of at most {MAX_DIMENSION_VALUE} characters"
    return ""


def interval_problem(interval_s: float) -> str:
    """Why the publisher cannot send every `interval_s` seconds, "" where it can: each call is
    credited to one period (publisher.py), so the calls must divide the period evenly."""
    calls = PERIOD_S / interval_s
    if calls < 1 or abs(calls - round(calls)) > 1e-6:
        return (
            f"a CloudWatch interval of {interval_s:g} s does not divide the scaling policies' "
            f"{PERIOD_S} s period: some periods would read one interval's samples and others two "
            f"or none (take 60, 30, 20, 15, 10 or 5)"
        )
    return ""


def dimensions(model: str) -> dict[str, str]:
    """The metrics' dimensions for one served model."""
    return {MODEL_DIMENSION: model}
