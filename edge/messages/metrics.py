"""Prometheus counters of the message writer (default registry, served by the edge's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

MESSAGES_WRITTEN = Counter("floodgate_messages_written_total", "Messages written to the message store.")
MESSAGES_DROPPED = Counter(
    "floodgate_messages_dropped_total",
    "Messages not written: the writer queue was full or closed, or the writer shut down first.",
)
MESSAGES_FAILED = Counter(
    "floodgate_messages_failed_total", "Messages given up on after every retry of the store write failed."
)
MESSAGE_WRITE_RETRIES = Counter(
    "floodgate_message_write_retries_total", "Store writes retried after a failure."
)
