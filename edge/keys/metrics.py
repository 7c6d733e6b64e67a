"""Prometheus counters of key checks (default registry, served by the edge's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

KEY_LOOKUPS = Counter(
    "floodgate_key_lookups_total",
    "API key lookups by where the answer came from: this edge's cache, the shared key store, or "
    "shared (another request's read of the same key, under way).",
    ["source"],
)
KEY_REFUSALS = Counter(
    "floodgate_key_refusals_total", "Requests refused for their API key, by reason.", ["reason"]
)
