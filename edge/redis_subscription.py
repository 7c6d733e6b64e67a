"""One Redis pub/sub channel, subscribed in the background and subscribed again, with backoff,
whenever the connection breaks.

The cancel bus (edge/cancel/bus.py) and key changes (edge/keys/changes.py) both listen this way.
Pub/sub loses what is published while a subscriber is away, so each (re)subscription is reported
(`on_subscribed`): key changes then forget every cached key, the cancel bus looks up in the store
whether a request running here was cancelled meanwhile.
Redis being away is not an error of the edge: the retries go on until `aclose`. A link that dies
without a word (a NAT or load balancer dropping it, a host gone without a reset) is found by a
PING on a channel idle for `idle_ping_s` whose answer takes over `pong_timeout_s`: the connection
is then dropped and subscribed again like a broken one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from edge.task_stop import cancelling, stop_task

log = structlog.get_logger("floodgate.redis_subscription")

OnMessage = Callable[[bytes | str], None]


class Subscription:
    def __init__(
        self,
        subscriber: Redis,
        channel: str,
        *,
        name: str,
        delay_s: float = 0.5,
        max_delay_s: float = 10.0,
        idle_ping_s: float = 5.0,
        pong_timeout_s: float = 5.0,
    ) -> None:
        """`subscriber` should have no read timeout (the channel is idle for long stretches: the
        pings here tell a quiet link from a dead one); `name` names the task and the log events
        (`<name>_subscription_lost`)."""
        self._subscriber = subscriber
        self._channel = channel
        self._name = name
        self._delay_s = delay_s
        self._max_delay_s = max_delay_s
        self._idle_ping_s = idle_ping_s
        self._pong_timeout_s = pong_timeout_s
        self._listener: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    def start(self, on_message: OnMessage, on_subscribed: Callable[[], None] = lambda: None) -> None:
        """Listen in the background: `on_subscribed` after every (re)subscription, `on_message`
        with each message's payload."""
        self._listener = asyncio.create_task(
            self._listen(on_message, on_subscribed), name=f"{self._name}-listener"
        )

    async def wait_subscribed(self, timeout_s: float) -> bool:
        """Whether the subscription is up, waiting for it at most `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.subscribed.wait()
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        """Stop listening and close the subscriber's connections."""
        if self._listener is not None:
            await stop_task(self._listener)
            self._listener = None
        await self._subscriber.aclose()

    async def _listen(self, on_message: OnMessage, on_subscribed: Callable[[], None]) -> None:
        # A link that was up is tried again at once: a dropped connection (a reset, a failover, a
        # CLIENT KILL) usually reconnects on the first try, and every moment away loses messages.
        # Backoff starts with the second failure in a row.
        delay_s = 0.0
        while True:
            try:
                async with self._subscriber.pubsub() as pubsub:
                    await pubsub.subscribe(self._channel)
                    # Not pubsub.listen(): it waits on the socket for ever, and redis-py's
                    # health_check_interval only pings before a read, so a silent link is never seen.
                    ping_sent_at: float | None = None
                    while True:
                        message = await pubsub.get_message(timeout=self._idle_ping_s)
                        now = asyncio.get_running_loop().time()
                        if message is None:
                            if ping_sent_at is None:
                                await pubsub.ping()
                                ping_sent_at = now
                            elif now - ping_sent_at > self._pong_timeout_s:
                                raise RedisConnectionError("no answer to a PING on the subscription")
                            continue
                        ping_sent_at = None  # anything read shows the link is alive
                        if message["type"] == "subscribe":
                            on_subscribed()
                            self.subscribed.set()
                            delay_s = 0.0
                        elif message["type"] == "message":
                            on_message(message["data"])
            except (RedisError, OSError) as exc:
                if cancelling():
                    raise asyncio.CancelledError from exc  # a stop that the Redis call turned into this
                # Reconnect and resubscribe, backing off while Redis stays away.
                self.subscribed.clear()
                log.warning(
                    f"{self._name}_subscription_lost",
                    channel=self._channel,
                    error=type(exc).__name__,
                    retry_in_s=delay_s,
                )
                await asyncio.sleep(delay_s)
                delay_s = min(max(delay_s * 2, self._delay_s), self._max_delay_s)
