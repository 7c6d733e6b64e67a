"""One reading of a Redis URL for every part that connects to the limiter's Redis: which scheme
names a Cluster, and which node a plain connection (pub/sub) goes to. Against a real redis-server."""

from __future__ import annotations

import re

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ReadOnlyError

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


# What redis-server 6.2.14 answers a script whose first write meets a replica, verbatim: a Redis before
# 7 wraps the error a script met in its own (7 keeps the READONLY code).
REDIS_6_SCRIPT_READ_ONLY = (
    "ERR Error running script (call to f_d0ff243c40d9f03558963d484000e4ed192a01cb): @user_script:10:"
    " @user_script: 10: -READONLY You can't write against a read only replica."
)


def _stat(server: RedisServer, section: str, pattern: str) -> int:
    found = re.search(pattern, server.command("INFO", section).decode())
    return int(found.group(1)) if found else 0


@pytest.mark.anyio
async def test_a_script_refused_read_only_by_a_redis_before_7_is_sent_again_on_a_new_connection(
    redis_server: RedisServer,
) -> None:
    """On Redis 6 (ElastiCache 6.x) a script on a demoted primary's connection failed as a plain
    error: it was never sent again on a new connection, which the endpoint leads to the new primary,
    and every cancel, publish and fleet beat on that connection failed until the edge restarted.
    The reply is Redis 6.2's, sent here by a script of a Redis 7."""
    client = redis_url.connect_node(redis_server.url, socket_timeout=5)
    try:
        await client.ping()
        connections = _stat(redis_server, "stats", r"total_connections_received:(\d+)")
        evals = _stat(redis_server, "commandstats", r"cmdstat_eval:calls=(\d+)")
        with pytest.raises(ReadOnlyError):
            await client.eval("return redis.error_reply(ARGV[1])", 0, REDIS_6_SCRIPT_READ_ONLY)
        assert _stat(redis_server, "commandstats", r"cmdstat_eval:calls=(\d+)") == evals + 2
        assert _stat(redis_server, "stats", r"total_connections_received:(\d+)") > connections
    finally:
        await client.aclose()
