"""The limiter's Prometheus metrics (default registry, served by the edge's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

STORE_FAILURES = Counter(
    "floodgate_limiter_store_failures",
    "Limiter calls to the shared store (Redis) that failed or timed out, by operation.",
    ["op"],
)
FALLBACK_ACTIVE = Gauge(
    "floodgate_limiter_fallback_active",
    "1 while the shared store is failing and the limiter answers from its local fallback, else 0.",
)
