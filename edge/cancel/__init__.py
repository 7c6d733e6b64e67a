"""Cancelling a generation, in one place.

- outcome.py: `CancelOutcome`, the one answer type (endpoint, registries, bus, store), and
  `CancelAnswer`, a registry's: the outcome, and whether the fleet's store gave it.
- live.py: `LiveRequest`, a request in flight, and the contract between a cancel and a generation
  that ends on its own (whichever comes first decides).
- registry.py: `RequestRegistry` (what the pipeline and the cancel route need) and `CancelRegistry`,
  this instance's live and recently finished requests.
- bus.py: `CancelBus` and `RedisCancelBus`, cancel across instances; shared.py:
  `SharedCancelRegistry`, the registry that mirrors this instance's into the bus.
- factory.py: which registry an edge runs with. stream_close.py: closing a token stream early, the
  Upstream protocol's way to cancel a generation on its replica.

A client disconnect cancels too: edge/streaming.py runs the stream in a scope that the disconnect
cancels, and the pipeline's clean-up closes the replica's stream.
"""

from edge.cancel.bus import CancelBus, CancelBusUnavailable, RedisCancelBus
from edge.cancel.factory import open_request_registry
from edge.cancel.live import LiveRequest
from edge.cancel.outcome import CancelAnswer, CancelOutcome
from edge.cancel.registry import CancelRegistry, RequestRegistry
from edge.cancel.shared import SharedCancelRegistry
from edge.cancel.stream_close import aclose_stream

__all__ = [
    "CancelAnswer",
    "CancelBus",
    "CancelBusUnavailable",
    "CancelOutcome",
    "CancelRegistry",
    "LiveRequest",
    "RedisCancelBus",
    "RequestRegistry",
    "SharedCancelRegistry",
    "aclose_stream",
    "open_request_registry",
]
