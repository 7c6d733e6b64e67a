"""PUBLISH that only a primary accepts, for the cancel bus and key changes.

A standalone Redis failed over behind its primary endpoint (ElastiCache without cluster mode,
Sentinel) keeps the connections opened before, demoted to a replica. A plain PUBLISH on one of them
succeeds: a replica never answers READONLY to it (it is no write), but it reaches only that
server's subscribers, while the other edges have subscribed again through the endpoint, to the new
primary. A user's cancel sent to one edge for a stream on another was lost (the GPU kept
generating), and a revoked key stayed usable on the others until their cache TTL.

So the message goes in a script whose first call is a write that changes nothing (PERSIST of a key
nobody sets): a replica refuses it READONLY before the PUBLISH runs, and redis_url.connect_node's
reconnect-and-resend sends it again on a new connection, which the endpoint leads to the new
primary. Chosen over asking ROLE now and then: no round trip of its own, no window after a failover
in which messages go to the replica until the next check, and nothing to schedule. Chosen over a
shebang script (which Redis 7 refuses on a replica up front, keyless): this runs on any version,
and a no-op PERSIST is a lookup in the key space, neither written to the AOF nor replicated.

A Redis Cluster needs none of it: a PUBLISH on any node, a replica too, is broadcast to every node
over the cluster bus, and a cluster replica would refuse the script. A user or server refusing the
script (an ACL without PERSIST or the key, scripting off) gets a plain PUBLISH, and a log line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import BusyLoadingError, MasterDownError, NoScriptError, ReadOnlyError, ResponseError

log = structlog.get_logger("floodgate.primary_publish")

Publish = Callable[[str, bytes | str], Awaitable[object]]  # (channel, message)

# A key that is never set: PERSIST of it answers 0 and changes nothing, but it is a write command.
PRIMARY_CHECK_KEY = "floodgate:publish-on-primary"

# KEYS: PRIMARY_CHECK_KEY. ARGV: channel, message.
PUBLISH_SCRIPT = """
redis.call('PERSIST', KEYS[1])
return redis.call('PUBLISH', ARGV[1], ARGV[2])
"""


def check_refused(exc: BaseException) -> bool:
    """Whether `exc`, the answer to the no-op write or a script around it, says that this server or
    user never runs it: an ACL without its key, PERSIST, INFO or scripting (ElastiCache RBAC, least
    privilege users), a renamed command. Then the primary cannot be told this way and what relied
    on it goes on as before it (a failover is found later): refusing the whole cancel bus for it
    stopped every cancel and key change. Not READONLY, MASTERDOWN (a replica: what the check is
    for), LOADING (a restart) nor NOSCRIPT (an emptied script cache): they pass."""
    passing = (ReadOnlyError, MasterDownError, BusyLoadingError, NoScriptError)
    return isinstance(exc, ResponseError) and not isinstance(exc, passing)


def primary_publisher(client: Redis | RedisCluster, *, cluster: bool = False) -> Publish:
    """How to publish on `client`: through the script on a standalone server (its retry on READONLY
    comes from redis_url.connect_node), a plain PUBLISH where `client` is, or talks to a node of, a
    Redis Cluster (`cluster`)."""
    if cluster or isinstance(client, RedisCluster):
        return client.publish
    # EVALSHA, the script's body loaded once (redis-py loads it again after a NOSCRIPT).
    script = client.register_script(PUBLISH_SCRIPT)
    said_refused = False

    async def publish(channel: str, message: bytes | str) -> object:
        nonlocal said_refused
        try:
            return await script(keys=[PRIMARY_CHECK_KEY], args=[channel, message])
        except ResponseError as exc:
            if not check_refused(exc):
                raise
            # A user or server that refuses the script: a plain PUBLISH, as before the check, not
            # an error (every cancel answered 503 and no key change went out). Tried each time, so
            # a grant takes effect without a restart; said once.
            if not said_refused:
                said_refused = True
                log.warning(
                    "primary_publish_refused", channel=channel, error=type(exc).__name__, detail=str(exc)
                )
        return await client.publish(channel, message)

    return publish
