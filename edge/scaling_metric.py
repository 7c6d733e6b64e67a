"""The GPU pool's scaling metric, defined once: the edge publishes it, Terraform scales on it.

Each edge instance samples its own backlog for a model every `SAMPLE_INTERVAL_S` (requests waiting
in its admission queue divided by the GPU replicas it can dispatch to) and sends each interval's
samples in one call, each with its own timestamp. Summing every edge's samples over one `PERIOD_S`
and dividing by `SAMPLES_PER_PERIOD` gives the fleet's backlog per replica, whatever the number of
edge instances: that quotient is what the Auto Scaling policy tracks (tests/iac checks the HCL).
"""

from __future__ import annotations

from typing import Final

NAMESPACE: Final = "Floodgate"
METRIC_NAME: Final = "QueueDepthPerReplica"
MODEL_DIMENSION: Final = "Model"
UNIT: Final = "Count"

SAMPLE_INTERVAL_S: Final = 10
PERIOD_S: Final = 60
SAMPLES_PER_PERIOD: Final = PERIOD_S // SAMPLE_INTERVAL_S


def dimensions(model: str) -> dict[str, str]:
    """The metric's dimensions for one served model."""
    return {MODEL_DIMENSION: model}
