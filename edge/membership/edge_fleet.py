"""The membership inside a running edge (edge/app.py's lifespan): with the redis limiter backend,
this process registers in the fleet and applies every new view to what used to read the static
`[limiter] instance_count`:

* every model's dispatcher on replicas the edges share (Triton hosts: every edge reaches them) fills
  `view.held_of(replica)` of each: its share while serving, 0 while joining, and while draining the
  falling claim its accepted streams (running or queued) still need; with `[fleet]
  members_per_replica` its part of each replica among that replica's few members, 0 on the others
  (assignment.py), worked out too for a replica discovered later as it joins the dispatcher.
  Replicas this process started for itself (its local engines, `--triton local`:
  PrivateUpstreams) no other edge fills: they are not divided, and an edge with only those has
  nobody to wait for when it joins;
* the fail-open fallback limiter divides each limit by `view.divisor`;
* the limiter frees the concurrency slots of `view.departed`, members that stopped beating: their
  streams died with them (a crash, a kill), and their users would otherwise be refused for up to the
  slots' TTL ([limiter] slot_ttl_s, 5 minutes by default) for streams nobody serves;
* back after being counted out itself (it only stalled, its streams live), this process has the
  limiter put its running requests' slots back (`restore_slots`), as it does on finding a Redis
  that lost the fleet (restarted empty, FLUSHALL), which lost the limiter's keys too.

A member is one process: its id carries the host and the pid, so `serve --workers N` counts N, and
ends with the tag its request ids carry (edge/request_ids.py).
On drain (edge/drain.py) the claim follows the fraction of the streams open at the drain's start
that are still open, so the others take the share over as the streams end. `/readyz` answers 503
while the share is 0 (joining, on shared replicas): the load balancer sends nothing before the
others made room; a `serve --workers` worker, whose port no load balancer checks alone, listens on
it only then (edge/server.py).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager

import structlog
from prometheus_client import Gauge
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from edge.admission.dispatcher import Dispatcher
from edge.config import FleetConfig, LimiterConfig
from edge.drain import Drain
from edge.membership.membership import FleetMembership, MembershipSettings
from edge.membership.shares import FleetView
from edge.request_ids import holder_prefix, process_tag
from limiter import redis_url

log = structlog.get_logger("floodgate.fleet")

LIVE = Gauge("floodgate_fleet_live_instances", "Edge instances live in the fleet, as this one last saw.")
SHARE = Gauge(
    "floodgate_fleet_replica_share",
    "This instance's part of the fleet: the fraction of every replica the edges share (Triton "
    "hosts) it may fill, or with members_per_replica what it would be (it fills 1/K of those it "
    "is among); 0 while joining or draining.",
)
DIVISOR = Gauge("floodgate_fleet_limit_divisor", "What the fail-open limiter divides every limit by.")
FILLED = Gauge(
    "floodgate_fleet_replicas_filled",
    "The replicas the edges share that this instance may fill now (with members_per_replica, those "
    "it is among the members of).",
)


def member_id() -> str:
    """Unique per process: host and pid (workers of one host differ), then the process's tag, a
    nonce (a pid reused after a restart must not inherit a dead member's claim) that its request ids
    carry too, so that the fleet can tell which slots a departed member held."""
    return f"{socket.gethostname()}:{os.getpid()}:{process_tag()}"


def _client(limiter: LimiterConfig, timeout_s: float) -> Redis | RedisCluster:
    return redis_url.connect(
        limiter.redis_url,
        cluster=limiter.redis_cluster,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )


def apply_view(
    dispatchers: Sequence[Dispatcher],
    set_divisor: Callable[[int], None] | None,
    free_slots_of: Callable[[Collection[str]], None] | None = None,
) -> Callable[[FleetView], None]:
    def filled() -> int:
        return sum(dispatcher.replicas.filled() for dispatcher in dispatchers)

    def apply(view: FleetView) -> None:
        # The dispatchers fill what this instance's streams may hold (`held`), not only its share
        # for new work: a draining edge takes no new requests (the drain answers them 503), but the
        # streams it accepted before SIGTERM, queued ones included, still run on its falling claim.
        # Each replica's part worked out once per view (with members_per_replica, a ranking of
        # every live member per replica), kept for replicas discovered until the next view.
        held_of = functools.cache(view.held_of)
        for dispatcher in dispatchers:
            dispatcher.set_replica_shares(held_of)
        if set_divisor is not None:
            set_divisor(view.divisor)
        if free_slots_of is not None:
            free_slots_of([holder_prefix(tag) for tag in view.departed])
        LIVE.set(view.live)
        SHARE.set(view.share)
        DIVISOR.set(view.divisor)
        # Read at each scrape, not set here: a replica discovered after this view (asg:, a scale
        # from zero) joins at its share without a new view, which a steady fleet may not see for
        # good, and the gauge read 0 on every serving edge meanwhile.
        FILLED.set_function(filled)
        log.info(
            "fleet_view",
            live=view.live,
            share=round(view.share, 6),
            divisor=view.divisor,
            source=view.source,
            replicas_filled=filled(),
            departed=list(view.departed),
        )

    return apply


@asynccontextmanager
async def joined_fleet(
    limiter: LimiterConfig,
    fleet: FleetConfig,
    dispatchers: Sequence[Dispatcher],
    drain: Drain,
    set_divisor: Callable[[int], None] | None,
    free_slots_of: Callable[[Collection[str]], None] | None = None,
    restore_slots: Callable[[], None] | None = None,
) -> AsyncIterator[FleetMembership]:
    """Join the fleet (the first beat, done here), keep beating, leave on exit."""
    settings = MembershipSettings(
        instance_count=limiter.instance_count,
        interval_s=fleet.heartbeat_s,
        join_wait_s=2 * fleet.heartbeat_s,
        ttl_s=fleet.member_ttl_s,
        stale_after_s=fleet.stale_after_s,
        remember_departed_s=limiter.slot_ttl_s,
        members_per_replica=fleet.members_per_replica,
        timeout_s=fleet.heartbeat_s,  # the client's: one beat waits no longer, retries and all
    )
    client = _client(limiter, settings.beat_bound_s)
    membership = FleetMembership(
        client,
        member_id(),
        settings,
        apply_view(dispatchers, set_divisor, free_slots_of),
        on_back=restore_slots,
        on_lost=restore_slots,
    )

    def hand_over() -> None:
        open_at_start = drain.running
        membership.begin_drain(lambda: drain.running / open_at_start if open_at_start else 0.0)

    drain.on_begin(hand_over)
    try:
        await membership.start()
        log.info("fleet_joined", member=membership.member_id, live=membership.view.live)
        yield membership
    finally:
        await membership.aclose()
        await client.aclose()
