"""Replica discovery driving the Dispatcher's membership, with an Auto Scaling group in moto.

moto's instances run no Triton: each discovered `HOST:PORT:PORT` becomes a controlled upstream
named after it, and the tests check which replicas the dispatcher (and the app) hold.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY

from edge.admission import Dispatcher
from edge.config import Settings
from edge.upstreams.asg_resolver import AsgResolver, AsgSpec
from edge.upstreams.base import Upstream
from edge.upstreams.replica_discovery import ReplicaDiscovery
from tests.admission.flow import ticket, until
from tests.admission.replicas import ControlledUpstream
from tests.edge.sse_client import wait_until
from tests.fleet.conftest import GpuGroup
from tests.support.live_server import start_server

WAIT_S = 10.0


def _resolver(group: GpuGroup) -> AsgResolver:
    return AsgResolver(AsgSpec(group.name), group.autoscaling, group.ec2)


def _failures() -> float:
    return REGISTRY.get_sample_value("floodgate_replica_discovery_failures_total") or 0.0


def _replica(spec: str) -> Upstream:
    return ControlledUpstream(f"replica-{spec}")


def _names(group: GpuGroup) -> list[str]:
    return sorted(f"replica-{ip}:8000:8002" for ip in group.in_service_ips())


@asynccontextmanager
async def _dispatcher(upstreams: list[Upstream]) -> AsyncIterator[Dispatcher]:
    dispatcher = Dispatcher(upstreams, reserved_paid_fraction=0.0, max_queue=100, poll_interval_s=0.05)
    await dispatcher.start()
    try:
        yield dispatcher
    finally:
        await dispatcher.aclose()


@pytest.mark.anyio
async def test_the_dispatcher_follows_the_groups_instances(gpu_group: GpuGroup) -> None:
    discovery = ReplicaDiscovery(
        _resolver(gpu_group).replica_specs, _replica, interval_s=0.05, group=gpu_group.name
    )
    assert await discovery.refresh()
    # Per group: an edge serving several models discovers each model's group.
    assert REGISTRY.get_sample_value("floodgate_replicas_discovered", {"group": gpu_group.name}) == 2
    async with _dispatcher(discovery.upstreams) as dispatcher, discovery.watch(dispatcher):
        assert sorted(dispatcher.upstream_names()) == _names(gpu_group)
        assert len(_names(gpu_group)) == 2

        await asyncio.to_thread(gpu_group.set_desired, 3)
        grown = await asyncio.to_thread(_names, gpu_group)
        await until(lambda: sorted(dispatcher.upstream_names()) == grown, WAIT_S)
        assert sorted(u.name for u in discovery.upstreams) == grown

        await asyncio.to_thread(gpu_group.set_desired, 1)
        shrunk = await asyncio.to_thread(_names, gpu_group)
        await until(lambda: sorted(dispatcher.upstream_names()) == shrunk, WAIT_S)
        slot = await dispatcher.acquire(ticket("u0"))
        assert [slot.upstream.name] == shrunk
        slot.release()
    await discovery.aclose()
    assert discovery.upstreams == []


@pytest.mark.anyio
async def test_a_failed_round_keeps_the_replicas_and_is_counted(gpu_group: GpuGroup) -> None:
    resolver = _resolver(gpu_group)
    discovery = ReplicaDiscovery(resolver.replica_specs, _replica, interval_s=60)
    assert await discovery.refresh()
    known = sorted(u.name for u in discovery.upstreams)
    failures = _failures()

    resolver.spec = AsgSpec("deleted-group")
    assert not await discovery.refresh()

    assert sorted(u.name for u in discovery.upstreams) == known
    assert _failures() == failures + 1
    await discovery.aclose()


class _Checked:
    """The names of the replicas whose health the edge has checked at least once (any thread)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.changed = threading.Condition()

    def wait_for(self, names: list[str]) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: set(names) <= self.names, WAIT_S)


class _ReportingUpstream(ControlledUpstream):
    def __init__(self, name: str, checked: _Checked) -> None:
        super().__init__(name)
        self._checked = checked

    async def ready(self) -> bool:
        with self._checked.changed:
            self._checked.names.add(self.name)
            self._checked.changed.notify_all()
        return await super().ready()


def test_a_served_edge_keeps_its_replicas_current(gpu_group: GpuGroup, tmp_path: Path) -> None:
    checked = _Checked()

    @asynccontextmanager
    async def provide(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
        discovery = ReplicaDiscovery(
            _resolver(gpu_group).replica_specs,
            lambda spec: _ReportingUpstream(f"replica-{spec}", checked),
            interval_s=settings.upstream.discovery_interval_s,
        )
        await discovery.refresh()
        try:
            yield discovery.upstreams
        finally:
            await discovery.aclose()

    def ready_replicas(ops_url: str) -> list[str]:
        return sorted(httpx.get(ops_url + "/readyz", timeout=5.0).json()["replicas"])

    with start_server(tmp_path, {"upstream": {"discovery_interval_s": 0.05}}, provide) as server:
        assert ready_replicas(server.ops_url) == _names(gpu_group)

        gpu_group.set_desired(3)
        grown = _names(gpu_group)
        assert checked.wait_for(grown), "the edge never health-checked the new replica"

        assert ready_replicas(server.ops_url) == grown
        assert sorted(server.app.state.runtime.pipeline.dispatcher.upstream_names()) == grown

        # Scaled in: the hosts that left leave /metrics too (a dashboard summing over replicas
        # would count them for ever).
        def exported() -> list[str]:
            lines = server.metrics_text().splitlines()
            # This group's replicas: other tests in the process record theirs in the same registry.
            prefix = 'floodgate_replica_kv_tokens{model="",replica="replica-'
            return sorted(
                "replica-" + line[len(prefix) :].split('"')[0] for line in lines if line.startswith(prefix)
            )

        assert exported() == grown
        gpu_group.set_desired(1)
        wait_until(lambda: len(ready_replicas(server.ops_url)) == 1, what="the scale-in to reach the edge")
        assert exported() == ready_replicas(server.ops_url)
