"""One reading of a Redis URL for every part that connects to the limiter's Redis: which scheme
names a Cluster, and which node a plain connection (pub/sub) goes to. Against a real redis-server."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis, RedisCluster

from limiter import redis_url
from tests.support.redis_server import RedisServer


def test_the_cluster_scheme_or_the_flag_names_a_cluster() -> None:
    assert redis_url.is_cluster("redis+cluster://10.0.0.1:7000/0")
    assert redis_url.is_cluster("rediss+cluster://10.0.0.1:7000/0")
    assert redis_url.is_cluster("redis://10.0.0.1:7000/0", cluster=True)
    assert not redis_url.is_cluster("redis://10.0.0.1:6379/0")


def test_a_cluster_url_names_its_seed_node() -> None:
    assert redis_url.node_url("redis+cluster://10.0.0.1:7000/0") == "redis://10.0.0.1:7000/0"
    assert redis_url.node_url("redis://10.0.0.1:6379/2") == "redis://10.0.0.1:6379/2"
    assert redis_url.node_url("rediss+cluster://:t@10.0.0.1:7000/0") == "rediss://:t@10.0.0.1:7000/0"


def test_a_cluster_url_gets_a_cluster_client() -> None:
    assert isinstance(redis_url.connect("redis+cluster://127.0.0.1:1/0"), RedisCluster)
    assert isinstance(redis_url.connect("redis://127.0.0.1:1/0", cluster=True), RedisCluster)
    assert isinstance(redis_url.connect("redis://127.0.0.1:1/0"), Redis)


@pytest.mark.anyio
async def test_a_plain_connection_reaches_the_node_a_cluster_url_names(redis_server: RedisServer) -> None:
    as_cluster = redis_server.url.replace("redis://", "redis+cluster://", 1)
    client = redis_url.connect_node(as_cluster, socket_timeout=5)
    try:
        assert await client.ping()
    finally:
        await client.aclose()
