"""Key changes announced to every edge over Redis pub/sub (where the limiter uses Redis).

A revoke, rotation or tier change publishes the key's hash on `floodgate:keys`; every edge is
subscribed and drops that key's cached lookup, so the change takes effect fleet-wide at once. Pub/sub
loses what is published while a subscriber is away: on every (re)subscription the edge drops its
whole cache, and the cache TTL bounds the rest (edge/keys/authenticator.py). A hash is no secret."""

from __future__ import annotations

from collections.abc import Callable

from redis.exceptions import RedisError

from edge.primary_publish import primary_publisher
from edge.redis_subscription import Subscription
from limiter import redis_url

CHANNEL = "floodgate:keys"
OnChange = Callable[[str | None], None]  # a key's hash, or None: forget every key


class RedisKeyChanges:
    def __init__(
        self,
        url: str,
        *,
        timeout_ms: int = 250,
        cluster: bool = False,
        channel: str = CHANNEL,
        primary_check_s: float = 5.0,
    ) -> None:
        """`cluster`: the config's `redis_cluster` flag (a `redis+cluster://` URL says so itself);
        `primary_check_s`: how often the subscription checks it is on the endpoint's primary
        (edge/redis_subscription.py; never in a Cluster)."""
        timeout_s = timeout_ms / 1000
        # Classic pub/sub reaches every node of a Cluster: plain connections to the node in the URL.
        publisher = redis_url.connect_node(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        in_cluster = redis_url.is_cluster(url, cluster=cluster)
        self._publisher = publisher
        self._publish = primary_publisher(publisher, cluster=in_cluster)
        # No read timeout on the subscription: it is idle until a key changes.
        subscriber = redis_url.connect_node(
            url, socket_connect_timeout=timeout_s, health_check_interval=30, socket_keepalive=True
        )
        self._channel = channel
        self._subscription = Subscription(
            subscriber,
            channel,
            name="key_changes",
            primary_check_s=None if in_cluster else primary_check_s,
        )
        self.subscribed = self._subscription.subscribed

    async def announce(self, key_sha256: str) -> bool:
        """Best effort: False when Redis could not be reached (the cache TTL still bounds the change)."""
        try:
            await self._publish(self._channel, key_sha256)
        except (RedisError, OSError):
            return False  # the caller says so where its user looks (the edge's log, the CLI's stderr)
        return True

    def start(self, on_change: OnChange) -> None:
        self._subscription.start(
            lambda data: on_change(data.decode() if isinstance(data, bytes) else str(data)),
            # Whatever was announced while away is unknown: forget every key.
            on_subscribed=lambda server: on_change(None),
        )

    async def aclose(self) -> None:
        await self._subscription.aclose()
        await self._publisher.aclose()
