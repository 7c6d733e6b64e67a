"""Prometheus metrics of the edge, on the process-wide registry that /metrics serves."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from edge.admission.cache_figures import CacheFigures
from edge.loop_histogram import LabelledLoopHistogram
from edge.upstreams.base import Capacity

# Past the longest queue wait a tier may have (the shipped paid tier's 120 s) and a prefill after it:
# ending at 60 s, an overload's every slow first token fell in +Inf, and histogram_quantile read a
# p99 of minutes as 60 s.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 180, 300)
# Past the longest silence a stream survives ([engine] stall_timeout_s, 120 s shipped; the Triton
# path's stall timeout, 60 s): a preemption, a prefill joining, a restart's replay or a slow Triton
# step is a gap between two tokens. Ending at 1.28 s, every such stall fell in +Inf and
# histogram_quantile could not tell a p99 stall of 2 s from one of 2 minutes.
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5, 10, 30, 60, 180)

# A whole request: a stream's reply runs on past its first token, up to the tier's max_tokens, with
# stalls of up to [engine] stall_timeout_s between tokens, after a queue wait of up to 120 s: past
# _LATENCY_BUCKETS' 300 s, so that a long reply's duration does not fall in +Inf.
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 600, 1200, 1800, 3600)

# `model`: the served model, "" where the edge serves one, as the queue's metrics name it
# (edge/admission/metrics.py): an edge serving several has a latency and a token count for each.
TTFT = LabelledLoopHistogram(
    "floodgate_time_to_first_token_seconds",
    "From the request's arrival to its first generated token.",
    ["model", "tier"],
    _LATENCY_BUCKETS,
)


# From arrival to the end, by how the request ended (the reasons of floodgate_requests_finished_total,
# so that each series' count is that counter's): vLLM's e2e_request_latency_seconds, queue wait
# included. TTFT and the inter-token gaps said when a reply began and how fast it ran, and nothing
# of how long a caller waited for the whole of it, nor how long a cancelled or refused one held on.
REQUEST_DURATION = LabelledLoopHistogram(
    "floodgate_e2e_request_latency_seconds",
    "From an admitted request's arrival to its end, by how it ended (the reasons of "
    "floodgate_requests_finished_total), queue wait included.",
    ["model", "tier", "reason"],
    _DURATION_BUCKETS,
)


class LoopGauge(Collector):
    """A label-less gauge moved from the event loop's thread only, so without the lock
    prometheus_client's Gauge takes per move: these two move four times per stream (about 0.8 µs
    each with the lock, 0.15 without; docs/bench-streams.md, sixth pass). The same exposition as
    a Gauge's (a gauge has no `_created` series)."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry = REGISTRY) -> None:
        self._name = name
        self._documentation = documentation
        self._value = 0.0
        registry.register(self)

    def inc(self, amount: float = 1.0) -> None:
        self._value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._value -= amount

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._documentation)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._documentation, value=self._value)


# Per model: a slow model's decoding mixed with a fast one's said nothing of either. A stream takes
# its model's series once (edge/generation.py), so a token pays no label lookup.
INTER_TOKEN = LabelledLoopHistogram(
    "floodgate_inter_token_latency_seconds",
    "Between two consecutive deltas of one stream.",
    ["model"],
    _ITL_BUCKETS,
)
REQUESTS_RUNNING = LoopGauge("floodgate_requests_running", "Requests holding a replica slot.")
# What users are charged (edge/generation.py `_billed`), counted as each request ends: a request
# refunded whole (turned away or cancelled while queued, answered with an error alone) adds nothing.
PROMPT_TOKENS = Counter(
    "floodgate_prompt_tokens_total", "Prompt tokens of requests charged to their users.", ["model", "tier"]
)
GENERATION_TOKENS = Counter(
    "floodgate_generation_tokens_total",
    "Generated tokens charged to their users.",
    ["model", "tier"],
)
# Each request lands in exactly one of these two, so an error rate is their 5xx (or 4xx) over
# their sum, neither counted twice: an admitted request's error status (a 502 not streamed) is how it
# finished, not a refusal as well.
REQUESTS_FINISHED = Counter(
    "floodgate_requests_finished_total",
    "Requests that got past admission, by how they ended: stop and length served; error, rejected, "
    "overloaded, limiter_unavailable, key_inactive, drained failed (answered with an error status, "
    "a 502 or 503, or cut mid-stream), counted here only, never in "
    "floodgate_requests_rejected_total; cancelled and disconnected, the client's doing.",
    ["model", "tier", "reason"],
)
# `model`: "" for a request that reached no configured model (none could be told from it, as a
# request the HTTP layer refuses, or it named one that is not served), and on an edge that serves
# one model; never the name a request sent, or each made-up name would be a series of its own.
# `tier`: the caller's configured tier, "" before its key was read (edge/errors.py REQUEST_TIER):
# a free tier's 429s are its limits at work, a paid tier's a page, and without it the two summed.
REQUESTS_REJECTED = Counter(
    "floodgate_requests_rejected_total",
    "Requests answered with an error status without being admitted, by status, code, model and "
    'tier ("" where no configured model or tier was reached); an admitted request\'s error is '
    "counted in floodgate_requests_finished_total only.",
    ["status", "code", "model", "tier"],
)
# The limiter's 429s by the limit that refused them: every one is code `rate_limit_exceeded` in
# floodgate_requests_rejected_total (the code clients test), so a tier spending its token budget and
# one held at its concurrency were one series there. `limit`: limiter/base.py's LimitName, a fixed set.
RATE_LIMITED = Counter(
    "floodgate_rate_limited_total",
    "Chat completions the rate limiter refused (429 rate_limit_exceeded), by model, tier and the"
    " limit that refused them: requests, tokens or concurrency (also counted in"
    " floodgate_requests_rejected_total).",
    ["model", "tier", "limit"],
)
OPEN_STREAMS = LoopGauge(
    "floodgate_open_streams", "Generations open in this process (server.max_open_streams bounds it)."
)
PAID_SHARE_KEPT = Counter(
    "floodgate_stream_reserve_refusals_total",
    "Free-tier generations refused 429 server_busy to keep the paid share of server.max_open_streams "
    "(also counted in floodgate_requests_rejected_total); the door's own refusals are not.",
)
CONNECTIONS_TURNED_AWAY = Counter(
    "floodgate_connections_turned_away_total",
    "New connections answered 503 server_busy and closed before any request was read: the process "
    "held as many as its open-file limit leaves room for (edge/connection_cap.py). No request was "
    "read, so none is counted in floodgate_requests_rejected_total.",
)
IDLE_CONNECTIONS_CLOSED = Counter(
    "floodgate_idle_connections_closed_total",
    "Idle client connections (kept alive after a response, or accepted and sent nothing) closed to "
    "make room for a new one at the connection cap (edge/idle_connections.py).",
)
DRAINING = Gauge("floodgate_draining", "1 from SIGTERM on: the process drains and takes no new work.")
STALLED_READERS_CUT = Counter(
    "floodgate_stalled_readers_cut_total", "Streams cut because their client stopped reading."
)

# Which replica: its name and the served model it is a replica of ("" on an edge serving one). The
# name alone does not say: a remote Triton replica is `triton-host:port` whatever model it serves,
# and renaming it would move its work (edge/membership/assignment.py hashes names). Bounded: the
# models are the settings', the replicas the fleet's.
_REPLICA = ("model", "replica")
REPLICA_RUNNING = Gauge("floodgate_replica_running_sequences", "Sequences running on a replica.", _REPLICA)
REPLICA_WAITING = Gauge("floodgate_replica_waiting_sequences", "Sequences waiting in a replica.", _REPLICA)
REPLICA_KV_USED = Gauge("floodgate_replica_kv_tokens_used", "KV-cache tokens in use.", _REPLICA)
REPLICA_KV_TOTAL = Gauge("floodgate_replica_kv_tokens", "KV-cache tokens a replica holds.", _REPLICA)
REPLICA_KV_BLOCKS = Gauge(
    "floodgate_replica_kv_blocks",
    "KV-cache blocks of a replica: used (held by sequences), cached (free, keeping a reusable prefix), "
    "free (the rest).",
    (*_REPLICA, "state"),
)
# The replica's own running totals, mirrored (gauges: a restarted replica starts again from 0).
REPLICA_PREFIX_HIT_TOKENS = Gauge(
    "floodgate_replica_prefix_cache_hit_tokens",
    "Prompt tokens a replica found in its prefix cache.",
    _REPLICA,
)
REPLICA_PREFIX_QUERY_TOKENS = Gauge(
    "floodgate_replica_prefix_cache_query_tokens",
    "Prompt tokens a replica looked up in its prefix cache (0: it does not say).",
    _REPLICA,
)
REPLICA_PREFIX_HIT_RATE = Gauge(
    "floodgate_replica_prefix_cache_hit_rate", "Prefix-cache hit tokens over looked-up tokens.", _REPLICA
)
REPLICA_PREEMPTIONS = Gauge(
    "floodgate_replica_preemptions", "Sequences a replica preempted to recompute later.", _REPLICA
)

REPLICA_RESTARTS = Gauge(
    "floodgate_replica_restarts",
    "Times a replica's engine died and was replaced since the edge started it (local engines).",
    _REPLICA,
)


# Without it a replica that stopped answering its health checks (a hung or dead Triton host) kept
# the gauges its last passing check set: a dashboard showed it busy and healthy, and nothing on
# /metrics could page on it (its reachability was only in /v1/internal/engine).
REPLICA_UP = Gauge(
    "floodgate_replica_up",
    "1 where a replica passed its last health check, 0 where it failed it (its other gauges keep "
    "what its last passing check read).",
    _REPLICA,
)


_PER_REPLICA = (
    REPLICA_UP,
    REPLICA_RUNNING,
    REPLICA_WAITING,
    REPLICA_KV_USED,
    REPLICA_KV_TOTAL,
    REPLICA_PREFIX_HIT_TOKENS,
    REPLICA_PREFIX_QUERY_TOKENS,
    REPLICA_PREFIX_HIT_RATE,
    REPLICA_PREEMPTIONS,
    REPLICA_RESTARTS,
)


def record_capacities(
    capacities: dict[tuple[str, str], Capacity],
    recorded: set[tuple[str, str]],
    alive: dict[tuple[str, str], bool] | None = None,
) -> None:
    """Every member replica's last capacity and whether it passed its last health check (`alive`),
    by (model, replica name), and the gauges of those no longer members (a scale-in took them)
    removed: left, a dashboard summing over replicas counts hosts long gone. `recorded`: the keys
    this app recorded last time, updated (one set per app: apps in one process share the registry)."""
    alive = alive or {}
    members = capacities.keys() | alive.keys()
    for gone in recorded - members:
        for gauge in _PER_REPLICA:
            with contextlib.suppress(KeyError):
                gauge.remove(*gone)
        for kind in ("used", "cached", "free"):
            with contextlib.suppress(KeyError):
                REPLICA_KV_BLOCKS.remove(*gone, kind)
    for (model, name), cap in capacities.items():
        record_capacity(model, name, cap)
    for (model, name), up in alive.items():
        REPLICA_UP.labels(model, name).set(1 if up else 0)
    recorded.clear()
    recorded.update(members)


def record_capacity(model: str, replica: str, cap: Capacity) -> None:
    REPLICA_RUNNING.labels(model, replica).set(cap.running)
    REPLICA_WAITING.labels(model, replica).set(cap.waiting)
    REPLICA_KV_USED.labels(model, replica).set(cap.kv_tokens_used)
    REPLICA_KV_TOTAL.labels(model, replica).set(cap.kv_tokens_total)
    figures = CacheFigures.of(cap)
    REPLICA_KV_BLOCKS.labels(model, replica, "used").set(figures.blocks_used)
    REPLICA_KV_BLOCKS.labels(model, replica, "cached").set(figures.blocks_cached)
    REPLICA_KV_BLOCKS.labels(model, replica, "free").set(figures.blocks_free)
    REPLICA_PREFIX_HIT_TOKENS.labels(model, replica).set(figures.prefix_hit_tokens)
    REPLICA_PREFIX_QUERY_TOKENS.labels(model, replica).set(figures.prefix_query_tokens)
    if figures.prefix_hit_rate is not None:
        REPLICA_PREFIX_HIT_RATE.labels(model, replica).set(figures.prefix_hit_rate)
    REPLICA_PREEMPTIONS.labels(model, replica).set(figures.preemptions)
    REPLICA_RESTARTS.labels(model, replica).set(cap.restarts)
