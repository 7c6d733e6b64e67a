"""Prometheus counters of the usage writer (default registry, served by the edge's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

USAGE_ROWS_WRITTEN = Counter("floodgate_usage_rows_written_total", "Usage rows added to the usage store.")
USAGE_DROPPED = Counter(
    "floodgate_usage_dropped_total", "Settled requests whose usage was not recorded (queue full or closed)."
)
USAGE_WRITE_RETRIES = Counter(
    "floodgate_usage_write_retries_total", "Usage store writes retried after a failure."
)
USAGE_WRITES_REPEATED = Counter(
    "floodgate_usage_writes_repeated_total",
    "Usage writes sent again after a lost answer that the store had already applied (not added twice).",
)
USAGE_READS_UNWRITTEN = Counter(
    "floodgate_usage_reads_unwritten_total",
    "Usage reads answered before this edge's queued usage of their user was written: "
    "the wait ([keys] usage_read_wait_s) ran out.",
)
