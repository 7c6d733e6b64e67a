"""`--triton asg:GROUP:GRPC:METRICS`: the Triton provider reads the group through boto3's default chain
(here: AWS_ENDPOINT_URL pointing at moto) and yields one Triton upstream per instance."""

from __future__ import annotations

import pytest

from edge.app import replica_provider
from edge.config import load_settings
from edge.upstreams.local_pool import local_upstreams
from edge.upstreams.replica_discovery import DiscoveredUpstreams
from edge.upstreams.triton import TritonUpstream
from tests.fleet.conftest import GpuGroup
from tests.support.live_server import demo_model_dir
from tests.support.moto_server import REGION


@pytest.mark.anyio
async def test_the_asg_spec_yields_a_triton_upstream_per_instance(
    gpu_group: GpuGroup, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    settings = load_settings(
        overrides={
            "model": {"source": "demo"},  # one model: the group is all its replicas
            "upstream": {"triton": f"asg:{gpu_group.name}:9001:9002", "region": REGION},
        }
    )

    async with replica_provider(settings)(settings, demo_model_dir()) as upstreams:
        assert isinstance(upstreams, DiscoveredUpstreams)
        ips = gpu_group.in_service_ips()
        assert sorted(u.name for u in upstreams) == sorted(f"triton-{ip}:9001" for ip in ips)
        assert all(isinstance(u, TritonUpstream) for u in upstreams)
        assert sorted(u.metrics_url for u in upstreams if isinstance(u, TritonUpstream)) == sorted(
            f"http://{ip}:9002/metrics" for ip in ips
        )
    assert list(upstreams) == []


def test_no_triton_spec_means_the_in_process_engines() -> None:
    assert replica_provider(load_settings()) is local_upstreams
