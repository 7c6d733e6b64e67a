"""The registry that answers cancel requests (API keys: tests/keys/)."""

from __future__ import annotations

from edge.cancel.outcome import CancelOutcome
from edge.cancel.registry import CancelRegistry


def test_cancel_registry_outcomes() -> None:
    registry = CancelRegistry()
    live = registry.register("r1", "alice")
    assert registry.cancel_local("r1", "mallory") is CancelOutcome.NOT_FOUND
    assert registry.cancel_local("nope", "alice") is CancelOutcome.NOT_FOUND
    assert registry.cancel_local("r1", "alice") is CancelOutcome.CANCELLED
    assert live.cancelled
    assert live.end() is True  # the cancel came first: the stream ends cancelled
    assert registry.cancel_local("r1", "alice") is CancelOutcome.CANCELLED  # again, as OpenAI's is
    registry.finish(live)
    assert registry.cancel_local("r1", "alice") is CancelOutcome.CANCELLED
    assert registry.cancel_local("r1", "mallory") is CancelOutcome.NOT_FOUND
    # One that ended on its own before any cancel: finished, while live and after.
    ended = registry.register("r2", "alice")
    assert ended.end() is False
    assert registry.cancel_local("r2", "alice") is CancelOutcome.FINISHED
    registry.finish(ended)
    assert registry.cancel_local("r2", "alice") is CancelOutcome.FINISHED
    assert len(registry) == 0


def test_finished_ids_are_bounded() -> None:
    registry = CancelRegistry(finished_capacity=2)
    for rid in ("a", "b", "c"):
        registry.finish(registry.register(rid, "u"))
    assert registry.cancel_local("a", "u") is CancelOutcome.NOT_FOUND
    assert registry.cancel_local("c", "u") is CancelOutcome.FINISHED
