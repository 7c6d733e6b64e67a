"""One Redis pub/sub channel, subscribed in the background and subscribed again, with backoff,
whenever the connection breaks.

The cancel bus (edge/cancel/bus.py) and key changes (edge/keys/changes.py) both listen this way.
Pub/sub loses what is published while a subscriber is away, so each (re)subscription is reported
(`on_subscribed`): key changes then forget every cached key, the cancel bus looks up in the store
whether a request running here was cancelled meanwhile, on the server the subscription is on (its
run id, handed to `on_subscribed`: in a failover's window the old primary still takes writes while
the endpoint leads to the new one, and a pooled connection left there reads no mark made since).
Redis being away is not an error of the edge: the retries go on until `aclose`. A link that dies
without a word (a NAT or load balancer dropping it, a host gone without a reset) is found by a
PING on a channel idle for `idle_ping_s` whose answer takes over `pong_timeout_s`: the connection
is then dropped and subscribed again like a broken one.

A standalone Redis failed over behind its primary endpoint (ElastiCache without cluster mode,
Sentinel) keeps the subscription's connection, on the old primary, demoted to a replica: it answers
the pings, but what is published on the new primary reaches it only once it replicates from it
(never, while it is behind), and as nothing broke, the cancels missed were never looked up and the
changed keys never forgotten. So, with `primary_check_s`, the subscription learns its server's run
id on its own connection before subscribing, and every `primary_check_s` asks the primary for its
run id (in a script a replica refuses READONLY, sent again on a new connection:
redis_url.connect_node): another server's drops the subscription, which subscribes again through
the endpoint, reported like any other. The cost: one EVALSHA of a small script per check and
subscription (an edge has two). Nothing cheaper tells which server a subscribed connection is on:
RESP2 allows it only PING and (UN)SUBSCRIBE. A Cluster needs no check (a PUBLISH reaches every
node, and its seed node may well be a replica): None. A server or user refusing the script (an ACL
without INFO or the check's key) gets a subscription unchecked, as before the check, and a log line
(`<name>_primary_check_refused`) on each subscription.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from edge.primary_publish import PRIMARY_CHECK_KEY, check_refused
from edge.task_stop import cancelling, stop_task

log = structlog.get_logger("floodgate.redis_subscription")

OnMessage = Callable[[bytes | str], None]
ServerId = bytes | str  # a server's run id, as PRIMARY_ID_SCRIPT answers it
# Called after each (re)subscription with the run id of the server it is on, None when unchecked.
OnSubscribed = Callable[[ServerId | None], None]

# The run id of the server it runs on, refused READONLY by a replica (a write that changes nothing
# first, edge/primary_publish.py). KEYS: PRIMARY_CHECK_KEY.
PRIMARY_ID_SCRIPT = """
redis.call('PERSIST', KEYS[1])
return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
"""


class PrimaryMoved(RedisConnectionError):
    """The endpoint leads to another primary than the one the subscription is on."""


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
        primary_check_s: float | None = None,
    ) -> None:
        """`subscriber` should have no read timeout (the channel is idle for long stretches: the
        pings here tell a quiet link from a dead one) and come from redis_url.connect_node; `name`
        names the task and the log events (`<name>_subscription_lost`); `primary_check_s`: how often
        to check that the subscription is on the endpoint's primary (None: never, for a Cluster)."""
        self._subscriber = subscriber
        self._channel = channel
        self._name = name
        self._delay_s = delay_s
        self._max_delay_s = max_delay_s
        self._idle_ping_s = idle_ping_s
        self._pong_timeout_s = pong_timeout_s
        self._primary_check_s = primary_check_s
        self._primary_id = subscriber.register_script(PRIMARY_ID_SCRIPT)
        self._listener: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    def start(self, on_message: OnMessage, on_subscribed: OnSubscribed = lambda server: None) -> None:
        """Listen in the background: `on_subscribed` after every (re)subscription, with the run id
        of the server it is on (None: unchecked, a Cluster or a refused check), `on_message` with
        each message's payload."""
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

    async def _listen(self, on_message: OnMessage, on_subscribed: OnSubscribed) -> None:
        # A link that was up is tried again at once: a dropped connection (a reset, a failover, a
        # CLIENT KILL) usually reconnects on the first try, and every moment away loses messages.
        # Backoff starts with the second failure in a row.
        delay_s = 0.0
        while True:
            try:
                async with self._subscriber.pubsub() as pubsub:
                    on_server = None if self._primary_check_s is None else await self._server_of(pubsub)
                    check_s = None if on_server is None else self._primary_check_s
                    await pubsub.subscribe(self._channel)
                    # Not pubsub.listen(): it waits on the socket for ever, and redis-py's
                    # health_check_interval only pings before a read, so a silent link is never seen.
                    ping_sent_at: float | None = None
                    check_at = asyncio.get_running_loop().time() + (check_s or 0)
                    while True:
                        message = await pubsub.get_message(
                            timeout=min(self._idle_ping_s, check_s or math.inf)
                        )
                        now = asyncio.get_running_loop().time()
                        if check_s is not None and on_server is not None and now >= check_at:
                            await self._check_primary(on_server)
                            check_at = now + check_s
                        if message is None:
                            if ping_sent_at is None:
                                await pubsub.ping()
                                ping_sent_at = now
                            elif now - ping_sent_at > self._pong_timeout_s:
                                raise RedisConnectionError("no answer to a PING on the subscription")
                            continue
                        ping_sent_at = None  # anything read shows the link is alive
                        if message["type"] == "subscribe":
                            on_subscribed(on_server)
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

    async def _server_of(self, pubsub: PubSub) -> ServerId | None:
        """The run id of the server `pubsub`'s connection reached, asked on that connection before
        it subscribes (then it can be asked nothing else). A replica (a name not yet moved after a
        failover) refuses READONLY: no subscription there, it is tried again. None, logged, where
        the server or the user refuses the script (edge/primary_publish.py's check_refused) or it
        finds no run id: the subscription goes on unchecked, as before there was a check, rather
        than being dropped and tried again for ever, which lost every cancel and key change."""
        await pubsub.connect()  # type: ignore[no-untyped-call]
        connection = pubsub.connection
        assert connection is not None  # connect() opened it
        try:
            async with asyncio.timeout(self._pong_timeout_s):
                await connection.send_command("EVAL", PRIMARY_ID_SCRIPT, 1, PRIMARY_CHECK_KEY)
                run_id = await connection.read_response()
        except ResponseError as exc:
            if not check_refused(exc):
                raise
            run_id = exc
        if isinstance(run_id, bytes | str) and run_id:
            return run_id
        log.warning(
            f"{self._name}_primary_check_refused",
            channel=self._channel,
            error=type(run_id).__name__,
            detail=str(run_id),
        )
        return None

    async def _check_primary(self, on_server: ServerId) -> None:
        """Raise PrimaryMoved when the endpoint's primary is not `on_server`. A primary that cannot
        be asked says nothing of the subscription: the pings watch its link."""
        try:
            async with asyncio.timeout(self._pong_timeout_s):
                primary = await self._primary_id(keys=[PRIMARY_CHECK_KEY])
        except (RedisError, OSError):
            return
        if primary != on_server:
            raise PrimaryMoved(f"the endpoint's primary is {primary!r}, the subscription is on {on_server!r}")
