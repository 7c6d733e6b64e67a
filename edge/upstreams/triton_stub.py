"""A Triton replica whose Python-backend stub died: Triton still says the model is ready.

Triton's health endpoints (`/v2/health/ready`, `/v2/models/M/ready`) keep answering 200 after the
stub process of a Python-backend model dies (killed, out of memory): readiness alone put the replica
back in rotation on the next poll, each poll costing one more user a failed request, and the
streams already open there got nothing more (Triton 2.51 sends them no error) until the edge's
stall timeout. Every request sent there is answered at once with this error, which is how the edge
learns of it (no probe per poll: a probe request made a misdeployed model "never ready").

The replica is then kept out until Triton's own request counts for the model say it serves again
(`/v2/models/M/stats`, read only while it is kept out): a count that went backwards is a new model
(tritonserver restarted, or the model was reloaded), a success is a request served there (another
edge's, once the stub is back). A plain readiness answer says neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

# Python backend (triton-inference-server/python_backend) 2.51's answer to a request for a model
# whose stub has died, `tensorrt_llm_0_0` being the model instance's stub; reproduced by killing the
# stub of a running local tritonserver (tests/triton/test_dead_stub.py).
_STUB_DEAD = re.compile(r"Stub process '[^']*' is not healthy")


def is_stub_dead(message: str) -> bool:
    """Whether a request's error says the model's stub process is gone (not a refusal, nor a
    model whose contract differs: those keep the replica's readiness as it is)."""
    return _STUB_DEAD.search(message) is not None


class _Count(msgspec.Struct):
    count: int = 0


class _InferenceStats(msgspec.Struct):
    success: _Count = msgspec.field(default_factory=_Count)
    fail: _Count = msgspec.field(default_factory=_Count)


class _VersionStats(msgspec.Struct):
    inference_stats: _InferenceStats = msgspec.field(default_factory=_InferenceStats)


class _ModelStats(msgspec.Struct):
    model_stats: list[_VersionStats] = []


_decode_stats = msgspec.json.Decoder(_ModelStats).decode


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """The model's completed requests, all versions together, as Triton's statistics say them."""

    succeeded: int
    failed: int


def parse_request_counts(body: bytes) -> RequestCounts:
    """The counts in a `/v2/models/M/stats` answer; ValueError for anything else."""
    try:
        stats = _decode_stats(body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not Triton's model statistics: {exc}") from exc
    versions = [version.inference_stats for version in stats.model_stats]
    return RequestCounts(sum(v.success.count for v in versions), sum(v.fail.count for v in versions))


@dataclass(frozen=True, slots=True)
class StubQuarantine:
    """Out of rotation since its stub died, when the model's counts were `seen`."""

    seen: RequestCounts

    @classmethod
    def since(cls, counts: RequestCounts) -> StubQuarantine:
        """Kept out from `counts`, read just after a request failed there: that failure is the
        dead model's whether or not Triton had counted it yet, so a model at 0 failures is new."""
        return cls(RequestCounts(counts.succeeded, max(counts.failed, 1)))

    def lifted_by(self, now: RequestCounts) -> bool:
        """A count below `seen` is a new model's (a restart or a reload starts them at 0); more
        successes are requests served. Failures that only grow are the dead stub's answers."""
        return now.succeeded != self.seen.succeeded or now.failed < self.seen.failed
