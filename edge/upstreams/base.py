"""The edge's name for the seam's contract (gpu_container/contract.py, where both sides import it).

Whoever the replica is (the local CPU engine, a local Triton, a fleet of Triton + TensorRT-LLM),
the edge sees this protocol only. The types are defined once, in gpu_container.contract; this
module re-exports them so that the edge's modules name the seam from edge/upstreams/.
"""

from __future__ import annotations

from gpu_container.contract import (
    Capacity,
    ContextLengthExceeded,
    Delta,
    FinishReason,
    GenerationRequest,
    ReplicaRestarting,
    RequestRejected,
    Restarts,
    Upstream,
    UpstreamError,
)

__all__ = [
    "Capacity",
    "ContextLengthExceeded",
    "Delta",
    "FinishReason",
    "GenerationRequest",
    "ReplicaRestarting",
    "RequestRejected",
    "Restarts",
    "Upstream",
    "UpstreamError",
]
