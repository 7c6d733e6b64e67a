"""Key changes announced to every edge over Redis pub/sub (where the limiter uses Redis).

A revoke, rotation or tier change publishes the key's hash on `floodgate:keys`; every edge is
subscribed and drops that key's cached lookup, so the change takes effect fleet-wide at once. Pub/sub
loses what is published while a subscriber is away: on every (re)subscription the edge drops its
whole cache, and the cache TTL bounds the rest (edge/keys/authenticator.py). A hash is no secret."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from redis.exceptions import RedisError

from limiter import redis_url

log = structlog.get_logger("floodgate.keys")

CHANNEL = "floodgate:keys"
OnChange = Callable[[str | None], None]  # a key's hash, or None: forget every key


class RedisKeyChanges:
    def __init__(self, url: str, *, timeout_ms: int = 250, channel: str = CHANNEL) -> None:
        timeout_s = timeout_ms / 1000
        # Classic pub/sub reaches every node of a Cluster: plain connections to the node in the URL.
        self._publisher = redis_url.connect_node(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        # No read timeout on the subscription: it is idle until a key changes.
        self._subscriber = redis_url.connect_node(
            url, socket_connect_timeout=timeout_s, health_check_interval=30
        )
        self._channel = channel
        self._listener: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    async def announce(self, key_sha256: str) -> bool:
        """Best effort: False when Redis could not be reached (the cache TTL still bounds the change)."""
        try:
            await self._publisher.publish(self._channel, key_sha256)
        except (RedisError, OSError):
            return False  # the caller says so where its user looks (the edge's log, the CLI's stderr)
        return True

    def start(self, on_change: OnChange) -> None:
        self._listener = asyncio.create_task(self._listen(on_change), name="key-changes-listener")

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        await self._publisher.aclose()
        await self._subscriber.aclose()

    async def _listen(self, on_change: OnChange, delay_s: float = 0.5, max_delay_s: float = 10.0) -> None:
        delay = delay_s
        while True:
            try:
                async with self._subscriber.pubsub() as pubsub:
                    await pubsub.subscribe(self._channel)
                    async for message in pubsub.listen():
                        if message["type"] == "subscribe":
                            on_change(None)  # whatever was announced while away is unknown
                            self.subscribed.set()
                            delay = delay_s
                        elif message["type"] == "message":
                            data = message["data"]
                            on_change(data.decode() if isinstance(data, bytes) else str(data))
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                log.warning("key_changes_subscription_lost", error=type(exc).__name__, retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, max_delay_s)
