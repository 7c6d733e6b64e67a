"""The one place that reads a Redis URL: `redis://…` names one server, `redis+cluster://…` a Redis
Cluster reached through the node it names (so does `redis://…` with cluster=True, the config's
`redis_cluster` flag); `rediss://…` and `rediss+cluster://…` are the same over TLS.

The limiter, the cancel bus, key changes and fleet membership all connect to the same Redis the
limiter's URL names; they used to parse the scheme each on their own. Here, in the limiter (a
library the edge may import, never the reverse), so all of them agree on what a URL means.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ReadOnlyError

from limiter.read_only_reply import ReadOnlyAwareParser

# A cluster scheme: the node scheme redis-py reads for it.
CLUSTER_SCHEMES = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}


def node_url(url: str) -> str:
    """The `redis://` (`rediss://`) URL of the node `url` names (a cluster URL's seed node)."""
    for scheme, node_scheme in CLUSTER_SCHEMES.items():
        if url.startswith(scheme):
            return node_scheme + url.removeprefix(scheme)
    return url


def is_cluster(url: str, *, cluster: bool = False) -> bool:
    """Whether `url` (or the `cluster` flag beside it) names a Redis Cluster."""
    return cluster or url.startswith(tuple(CLUSTER_SCHEMES))


def connect(url: str, *, cluster: bool = False, **options: Any) -> Redis | RedisCluster:
    """A client for the Redis, or Redis Cluster, `url` names; `options` go to redis-py's from_url.
    Opens nothing yet: redis-py connects on the first command."""
    if is_cluster(url, cluster=cluster):
        return RedisCluster.from_url(node_url(url), **options)
    return connect_node(url, **options)


def connect_node(url: str, **options: Any) -> Redis:
    """A plain client for the one node `url` names, even in a Cluster: classic pub/sub published on
    any node reaches subscribers on every node, so one connection to the seed node is enough.

    A READONLY reply closes the connection it came on and, unless the caller set its own `retry`,
    the command goes again once, on a new connection (no other failure is sent again: a timed-out
    command may have run). A standalone primary failed over behind its endpoint's name (ElastiCache
    without cluster mode, Sentinel) keeps the connections opened before, demoted to a replica: the
    cancel bus's script and fleet membership's beats met READONLY on them until the edge restarted
    (the limiter's pipelines, whose errors are replies, not raised, close theirs themselves:
    limiter/direct_calls.py). A plain PUBLISH succeeds on a replica: publishes go in a script it
    refuses (edge/primary_publish.py). A replica refuses a script at its first write, so nothing of
    it ran and sending it again is safe; a Redis before 7 words that refusal in a script error of
    its own, typed READONLY here too (limiter/read_only_reply.py)."""
    options.setdefault("parser_class", ReadOnlyAwareParser)  # Redis 6 wraps a script's READONLY
    options.setdefault("retry", Retry(NoBackoff(), 1, supported_errors=(ReadOnlyError,)))
    options["retry_on_error"] = [*options.get("retry_on_error", ()), ReadOnlyError]
    return Redis.from_url(node_url(url), **options)
