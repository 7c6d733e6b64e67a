"""Prometheus counters of the message writer (default registry, served by the edge's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
HISTORY_READS_WAITING = Gauge(
    "floodgate_history_reads_waiting",
    "History reads waiting for this edge's own unwritten messages of their conversation.",
)
HISTORY_READS_UNWRITTEN = Counter(
    "floodgate_history_reads_unwritten_total",
    "History reads answered before this edge's messages of their conversation were written: "
    "the wait ([messages] read_wait_s) ran out.",
)
CONVERSATION_LOCKS_SKIPPED = Counter(
    "floodgate_conversation_locks_skipped_total",
    "Requests on a named conversation admitted without its lock: the message store could not be "
    "asked (edge/messages/conversation_lock.py).",
)
CONVERSATION_LOCKS_LOST = Counter(
    "floodgate_conversation_locks_lost_total",
    "Conversation locks found expired while their request still ran: renewals failed for the "
    "lock's whole TTL.",
)
