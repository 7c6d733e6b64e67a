"""Cancel across edge instances: who owns a request, and a broadcast that reaches whoever runs it.

A request's stream lives on one edge instance; its cancel may arrive at any of them. When a request
starts, its instance records the owner (`track`), and the first SSE event, which carries the id, is
written only once that write is done (`SharedCancelRegistry.announce`, edge/cancel/shared.py): a
cancel sent to another instance right after it finds the owner.
`cancel` checks the owner (another user's id and an unknown id answer alike: NOT_FOUND), then
publishes the cancel; every instance is subscribed and hands it to `deliver(request_id, user)`, which
stops the stream if that instance holds it.

`RedisCancelBus` is the fleet's bus (tests/support/in_memory_cancel_bus.py is a one-process double
with the same answers). In Redis the owner is a string `<state>\\t<user>` at
`floodgate:cancel:{<request_id>}` (the hash tag keeps a request's key in one Cluster slot), with a
TTL so nothing outlives a crashed instance; cancels go over classic pub/sub, which a Redis Cluster
broadcasts to every node.

The contract between a cancel and a generation ending on its own (edge/cancel/live.py) holds
across instances too, decided in the store: a cancel marks a live record `cancelled` (one script:
check and mark), and the instance that runs the request, when its generation stops running, marks it
`done` and learns in the same script whether a cancel came first (`end`). So a cancel answered
CANCELLED anywhere always ends the stream cancelled, and one after the end answers FINISHED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import structlog
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from edge.cancel.outcome import CancelOutcome
from edge.redis_subscription import Subscription
from edge.task_stop import stop_task
from limiter import redis_url

log = structlog.get_logger("floodgate.cancel_bus")

Deliver = Callable[[str, str], object]  # (request_id, user): stop that stream if held here

CHANNEL = "floodgate:cancel"
LIVE, CANCELLING, DONE = "live", "cancelled", "done"

# Cancel: a live record of the user's becomes "cancelled" (kept TTL); answers what the record says.
_CANCEL_SCRIPT = """
local record = redis.call('GET', KEYS[1])
if not record then return 'not_found' end
local tab = string.find(record, '\\t', 1, true)
if not tab then return 'not_found' end
local state, owner = string.sub(record, 1, tab - 1), string.sub(record, tab + 1)
if owner ~= ARGV[1] then return 'not_found' end
if state == 'done' then return 'finished' end
if state == 'live' then redis.call('SET', KEYS[1], 'cancelled\\t' .. owner, 'KEEPTTL') end
return 'cancelled'
"""
# End: the record becomes "done" (finished TTL); returns 1 when a cancel had marked it first.
_END_SCRIPT = """
local cancelled = redis.call('GET', KEYS[1]) == ('cancelled\\t' .. ARGV[1])
redis.call('SET', KEYS[1], 'done\\t' .. ARGV[1], 'EX', ARGV[2])
if cancelled then return 1 end
return 0
"""

# What a store that is down or unsettled raises. redis-py's cluster client raises
# RedisClusterException (not a RedisError) when no node answers or a slot is not covered.
_STORE_ERRORS = (RedisError, RedisClusterException)


class CancelBusUnavailable(Exception):
    """The shared store could not be asked: answer 503, the request may still be running."""


class CancelBus(Protocol):
    async def start(self, deliver: Deliver) -> None:
        """Subscribe: once subscribed, deliver() is called for every cancel any instance publishes.
        Returns without waiting for a store that is down (start-up must not hang on it)."""
        ...

    async def track(self, request_id: str, owner: str) -> None:
        """A request started on this instance."""
        ...

    async def end(self, request_id: str, owner: str) -> bool:
        """The request's generation stopped running: from now on a cancel answers FINISHED. True
        when a cancel was accepted before (the outcome must then be cancelled)."""
        ...

    async def finish(self, request_id: str, owner: str) -> None:
        """The request ended; a cancel for it answers "finished" for a while, then "not_found"."""
        ...

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        """Check that `user` owns the request and, if it is live, broadcast its cancel."""
        ...

    async def aclose(self) -> None: ...


class _CancelMessage(msgspec.Struct, frozen=True):
    request_id: str
    user: str


def owner_key(request_id: str) -> str:
    return f"floodgate:cancel:{{{request_id}}}"


class RedisCancelBus:
    def __init__(
        self,
        client: Redis | RedisCluster,
        subscriber: Redis,
        *,
        ttl_s: int = 3600,
        finished_ttl_s: int = 600,
        channel: str = CHANNEL,
        reconnect_delay_s: float = 0.5,
        max_reconnect_delay_s: float = 10.0,
    ) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._finished_ttl_s = finished_ttl_s
        self._channel = channel
        self._subscription = Subscription(
            subscriber,
            channel,
            name="cancel_bus",
            delay_s=reconnect_delay_s,
            max_delay_s=max_reconnect_delay_s,
        )
        self._cluster_setup: asyncio.Task[None] | None = None

    @classmethod
    def from_url(
        cls, url: str, *, timeout_ms: int = 250, cluster: bool = False, **options: Any
    ) -> RedisCancelBus:
        """`redis://…` for one server, `redis+cluster://…` (or cluster=True) for a Cluster: keys go
        through the cluster client, the subscription to the node named in the URL."""
        timeout_s = timeout_ms / 1000
        client = redis_url.connect(
            url, cluster=cluster, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        # No read timeout on the subscription: it is idle until someone cancels.
        subscriber = redis_url.connect_node(url, socket_connect_timeout=timeout_s, health_check_interval=30)
        return cls(client, subscriber, **options)

    async def start(self, deliver: Deliver) -> None:
        """Subscribe in the background, retrying with backoff while Redis is unreachable (cancels
        published meanwhile reach only the instance that runs the request). A Cluster client also
        fetches its slot map and command table now, in the background: otherwise the first request
        pays for it (tens of milliseconds, more on a busy host) before its first event."""
        self._subscription.start(lambda data: self._handle(deliver, data))
        if isinstance(self._client, RedisCluster):
            self._cluster_setup = asyncio.create_task(
                self._set_up_cluster(self._client), name="cancel-bus-cluster-setup"
            )

    async def wait_subscribed(self, timeout_s: float) -> bool:
        """Whether the subscription is up, waiting for it at most `timeout_s`."""
        return await self._subscription.wait_subscribed(timeout_s)

    async def track(self, request_id: str, owner: str) -> None:
        # A store failure must not fail the request: it only loses cross-instance cancel for it.
        try:
            await self._client.set(owner_key(request_id), f"{LIVE}\t{owner}", ex=self._ttl_s)
        except _STORE_ERRORS as exc:
            log.warning("cancel_bus_track_failed", request_id=request_id, error=type(exc).__name__)

    async def end(self, request_id: str, owner: str) -> bool:
        try:
            marked = await self._client.eval(
                _END_SCRIPT, 1, owner_key(request_id), owner, self._finished_ttl_s
            )
        except _STORE_ERRORS as exc:
            # The store is away: this instance alone decides (a cancel another one took is lost).
            log.warning("cancel_bus_end_failed", request_id=request_id, error=type(exc).__name__)
            return False
        return bool(marked)

    async def finish(self, request_id: str, owner: str) -> None:
        try:
            await self._client.set(owner_key(request_id), f"{DONE}\t{owner}", ex=self._finished_ttl_s)
        except _STORE_ERRORS as exc:
            log.warning("cancel_bus_finish_failed", request_id=request_id, error=type(exc).__name__)

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        try:
            answer = await self._client.eval(_CANCEL_SCRIPT, 1, owner_key(request_id), user)
            outcome = CancelOutcome(answer.decode() if isinstance(answer, bytes) else answer)
            if outcome is CancelOutcome.CANCELLED:
                message = msgspec.json.encode(_CancelMessage(request_id, user))
                await self._client.publish(self._channel, message)
        except _STORE_ERRORS as exc:
            raise CancelBusUnavailable(str(exc)) from exc
        return outcome

    async def aclose(self) -> None:
        if self._cluster_setup is not None:
            await stop_task(self._cluster_setup)
            self._cluster_setup = None
        await self._subscription.aclose()
        await self._client.aclose()

    @staticmethod
    async def _set_up_cluster(client: RedisCluster) -> None:
        try:
            await client.initialize()
        except _STORE_ERRORS as exc:
            # Not fatal: the first command sets the client up again.
            log.warning("cancel_bus_cluster_setup_failed", error=type(exc).__name__)

    @staticmethod
    def _handle(deliver: Deliver, data: bytes | str) -> None:
        try:
            message = msgspec.json.decode(data, type=_CancelMessage)
        except msgspec.DecodeError:
            log.warning("cancel_bus_bad_message")
            return
        deliver(message.request_id, message.user)
