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
SETTLES_PENDING = Gauge(
    "floodgate_limiter_settles_pending",
    "Settles (slot frees and refunds) waiting to reach the shared store, retried until they land.",
)
SETTLES_EXPIRED = Counter(
    "floodgate_limiter_settles_expired",
    "Settles given up because their slot had expired on the store by itself (nothing left to free).",
)
SETTLES_DROPPED = Counter(
    "floodgate_limiter_settles_dropped",
    "Settles dropped because too many were pending; their slots expire with their lease TTL.",
)
STORE_BUSY = Counter(
    "floodgate_limiter_store_busy",
    "Limiter calls that found no free store connection within the pool wait (busy, not down).",
    ["op"],
)
CLUSTER_REDIRECTS = Counter(
    "floodgate_limiter_cluster_redirects",
    "Limiter calls a Redis Cluster node answered MOVED, ASK, TRYAGAIN or CLUSTERDOWN without running "
    "them (sent again: ASK to the node it names, TRYAGAIN after a pause, the others through redis-py), "
    "by that answer.",
    ["reply"],
)
SLOT_BUSY = Counter(
    "floodgate_limiter_slot_busy",
    "Limiter calls whose Redis Cluster slot, mid-migration, still answered TRYAGAIN after the "
    "retries: that call alone answered without Redis (the store is not marked down).",
    ["op"],
)
SLOT_MAP_RELOADS = Counter(
    "floodgate_limiter_slot_map_reloads",
    "Redis Cluster slot maps the limiter reloaded because a node's connection failed (a failover, a "
    "node gone).",
)
CONNECTIONS_OPENED = Counter(
    "floodgate_limiter_connections_opened",
    "Connections of its own the limiter opened to Redis nodes (one per node and process in a steady "
    "state: a rising count is reconnects).",
)
STALLED_CLOSED = Counter(
    "floodgate_limiter_stalled_connections_closed",
    "Connections of its own the limiter closed because a reply on them was overdue past the call "
    "timeout (a peer gone without a reset).",
)
