"""Triton replicas found in an EC2 Auto Scaling group (`--triton asg:GROUP[:HTTP_PORT[:METRICS_PORT]]`).

The group is read once before the app starts (so the first requests find the replicas there are),
then every `[upstream] discovery_interval_s` while it runs (see replica_discovery.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from edge.aws_client import aws_client
from edge.config import Settings
from edge.upstreams.asg_resolver import AsgResolver, parse_asg_spec
from edge.upstreams.base import Upstream
from edge.upstreams.replica_discovery import ReplicaDiscovery

# One discovery round must end well within its interval; retries stay few for the same reason.
_AWS_BOUNDS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 10,
    "retries": {"max_attempts": 3, "mode": "standard"},
}


def asg_resolver(spec: str, region: str = "") -> AsgResolver:
    """A resolver with boto3 clients from the default chain (AWS_ENDPOINT_URL is honoured)."""
    region_name = region or None
    return AsgResolver(
        parse_asg_spec(spec),
        aws_client("autoscaling", region_name=region_name, **_AWS_BOUNDS),
        aws_client("ec2", region_name=region_name, **_AWS_BOUNDS),
    )


@asynccontextmanager
async def discovered_triton_upstreams(
    spec: str, settings: Settings, make_upstream: Callable[[str], Upstream]
) -> AsyncIterator[list[Upstream]]:
    """The group's replicas now, kept current; the app's dispatcher watches them (see app.py)."""
    resolver = await anyio.to_thread.run_sync(asg_resolver, spec, settings.upstream.region)
    discovery = ReplicaDiscovery(
        resolver.replica_specs,
        make_upstream,
        interval_s=settings.upstream.discovery_interval_s,
        group=resolver.spec.group,
    )
    # A failure here is logged and counted: the edge starts with no replica and keeps looking.
    await discovery.refresh()
    try:
        yield discovery.upstreams
    finally:
        with anyio.CancelScope(shield=True):
            await discovery.aclose()
