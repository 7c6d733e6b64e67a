"""Keeps the edge's replicas equal to what a resolver finds (e.g. an Auto Scaling group's instances).

`resolve` is blocking (boto3) and runs in a worker thread, so a slow AWS API never stalls requests.
A failed resolve is logged and counted, and the replicas found last stay: an API hiccup must not
empty the fleet. Each resolved spec (`HOST:HTTP_PORT:METRICS_PORT`) becomes one upstream; a spec
that appears is added to the dispatcher, one that disappears is removed (the dispatcher drains it,
then closes it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import anyio.to_thread
import structlog
from prometheus_client import Counter, Gauge

from edge.task_stop import stop_task
from edge.upstreams.base import Upstream

log = structlog.get_logger(__name__)

RESOLVE_FAILURES = Counter(
    "floodgate_replica_discovery_failures_total",
    "Replica discovery rounds that failed (the replicas found before were kept).",
)
# `group`: the Auto Scaling group (one per served model, iac/): an edge serving several models
# discovers each model's replicas on its own.
DISCOVERED = Gauge(
    "floodgate_replicas_discovered", "Replicas the last successful discovery round found.", ["group"]
)


class ReplicaMembership(Protocol):
    """What discovery changes: the Dispatcher's replica set."""

    async def add_upstream(self, upstream: Upstream) -> None: ...

    def remove_upstream(self, name: str) -> None: ...


class ReplicaDiscovery:
    def __init__(
        self,
        resolve: Callable[[], list[str]],
        make_upstream: Callable[[str], Upstream],
        *,
        interval_s: float,
        group: str = "",
    ) -> None:
        self._resolve = resolve
        self._found = DISCOVERED.labels(group)
        self._make_upstream = make_upstream
        self._interval_s = interval_s
        self.upstreams = DiscoveredUpstreams(self)
        self._by_spec: dict[str, Upstream] = {}
        self._membership: ReplicaMembership | None = None

    async def refresh(self) -> bool:
        """One round: resolve, then add and remove replicas. False when resolving failed."""
        try:
            specs = set(await anyio.to_thread.run_sync(self._resolve))
        except Exception as exc:
            RESOLVE_FAILURES.inc()
            log.warning("replica_discovery_failed", error=str(exc), kept=len(self._by_spec))
            return False
        self._found.set(len(specs))
        for spec in [s for s in self._by_spec if s not in specs]:
            await self._drop(spec)
        for spec in sorted(specs - self._by_spec.keys()):
            await self._add(spec)
        return True

    def watch(self, membership: ReplicaMembership) -> AbstractAsyncContextManager[None]:
        """While open: apply every change to `membership`, resolving every interval_s."""
        return self._watch(membership)

    @asynccontextmanager
    async def _watch(self, membership: ReplicaMembership) -> AsyncIterator[None]:
        self._membership = membership
        task = asyncio.create_task(self._poll_forever(), name="replica-discovery")
        try:
            yield
        finally:
            await stop_task(task)
            self._membership = None

    async def aclose(self) -> None:
        """Close the current replicas (the dispatcher has closed the removed ones)."""
        for spec in list(self._by_spec):
            upstream = self._by_spec.pop(spec)
            self.upstreams.remove(upstream)
            await upstream.aclose()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.refresh()
            except Exception:  # a bug in one round must not end discovery for the life of the edge
                log.exception("replica_discovery_round_crashed")

    async def _add(self, spec: str) -> None:
        upstream = self._make_upstream(spec)
        self._by_spec[spec] = upstream
        self.upstreams.append(upstream)
        log.info("replica_discovered", replica=upstream.name)
        if self._membership is not None:
            await self._membership.add_upstream(upstream)

    async def _drop(self, spec: str) -> None:
        upstream = self._by_spec.pop(spec)
        self.upstreams.remove(upstream)
        log.info("replica_gone", replica=upstream.name)
        if self._membership is not None:
            self._membership.remove_upstream(upstream.name)
        else:
            await upstream.aclose()


class DiscoveredUpstreams(list[Upstream]):
    """The replicas found so far, kept current in place (so /readyz sees the fleet as it is now).

    An upstream provider yields this instead of a plain list when its replicas come and go: the app
    then calls `watch(dispatcher)` for as long as the dispatcher runs.
    """

    def __init__(self, discovery: ReplicaDiscovery) -> None:
        super().__init__()
        self._discovery = discovery

    def watch(self, membership: ReplicaMembership) -> AbstractAsyncContextManager[None]:
        return self._discovery.watch(membership)
