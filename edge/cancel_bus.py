"""Cancel across edge instances: who owns a request, and a broadcast that reaches whoever runs it.

A request's stream lives on one edge instance; its cancel may arrive at any of them. When a request
starts, its instance records the owner (`track`), and the first SSE event, which carries the id, is
written only once that write is done (`SharedCancelRegistry.announce`): a cancel sent to another
instance right after it finds the owner.
`cancel` checks the owner (another user's id and an unknown id answer alike: "not_found"), then
publishes the cancel; every instance is subscribed and hands it to `deliver(request_id, user)`, which
stops the stream if that instance holds it.

Two implementations: `InMemoryCancelBus` for one process (the embedded default) and `RedisCancelBus`
for a fleet. In Redis the owner is a string `<state>\\t<user>` at `floodgate:cancel:{<request_id>}`
(the hash tag keeps a request's key in one Cluster slot), with a TTL so nothing outlives a crashed
instance; cancels go over classic pub/sub, which a Redis Cluster broadcasts to every node.

`SharedCancelRegistry` plugs a bus into the edge: it is a `RequestRegistry` (edge/cancel.py) that
wraps the instance's own `CancelRegistry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Literal, Protocol

import msgspec
import structlog
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from edge.cancel import CancelOutcome, CancelRegistry, LiveRequest

log = structlog.get_logger("floodgate.cancel_bus")

CancelVerdict = Literal["cancelled", "not_found", "finished"]
Deliver = Callable[[str, str], object]  # (request_id, user): stop that stream if held here

CHANNEL = "floodgate:cancel"
_LIVE, _DONE = "live", "done"
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

    async def finish(self, request_id: str, owner: str) -> None:
        """The request ended; a cancel for it answers "finished" for a while, then "not_found"."""
        ...

    async def cancel(self, request_id: str, user: str) -> CancelVerdict:
        """Check that `user` owns the request and, if it is live, broadcast its cancel."""
        ...

    async def aclose(self) -> None: ...


class _CancelMessage(msgspec.Struct, frozen=True):
    request_id: str
    user: str


def owner_key(request_id: str) -> str:
    return f"floodgate:cancel:{{{request_id}}}"


def _verdict(record: str | None, user: str) -> CancelVerdict:
    if record is None:
        return "not_found"
    state, _, owner = record.partition("\t")
    if owner != user:
        return "not_found"
    return "finished" if state == _DONE else "cancelled"


class InMemoryCancelBus:
    """One process: the same answers as Redis. Live owners are dropped by finish(), which the edge
    calls for every request; finished ones age out after finished_ttl_s, oldest first."""

    def __init__(self, *, finished_ttl_s: float = 600.0) -> None:
        self._finished_ttl_s = finished_ttl_s
        self._live: dict[str, str] = {}
        self._finished: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (owner, expires at)
        self._deliver: Deliver | None = None

    async def start(self, deliver: Deliver) -> None:
        self._deliver = deliver

    async def track(self, request_id: str, owner: str) -> None:
        self._live[request_id] = owner

    async def finish(self, request_id: str, owner: str) -> None:
        self._expire()
        self._live.pop(request_id, None)
        self._finished[request_id] = (owner, time.monotonic() + self._finished_ttl_s)
        self._finished.move_to_end(request_id)

    async def cancel(self, request_id: str, user: str) -> CancelVerdict:
        self._expire()
        if request_id in self._live:
            verdict = _verdict(f"{_LIVE}\t{self._live[request_id]}", user)
        elif request_id in self._finished:
            verdict = _verdict(f"{_DONE}\t{self._finished[request_id][0]}", user)
        else:
            verdict = "not_found"
        if verdict == "cancelled" and self._deliver is not None:
            self._deliver(request_id, user)
        return verdict

    async def aclose(self) -> None:
        self._deliver = None

    def _expire(self) -> None:
        now = time.monotonic()
        while self._finished and next(iter(self._finished.values()))[1] <= now:
            self._finished.popitem(last=False)


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
        self._subscriber = subscriber
        self._ttl_s = ttl_s
        self._finished_ttl_s = finished_ttl_s
        self._channel = channel
        self._reconnect_delay_s = reconnect_delay_s
        self._max_reconnect_delay_s = max_reconnect_delay_s
        self._subscribed = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._cluster_setup: asyncio.Task[None] | None = None

    @classmethod
    def from_url(
        cls, url: str, *, timeout_ms: int = 250, cluster: bool = False, **options: Any
    ) -> RedisCancelBus:
        """`redis://…` for one server, `redis+cluster://…` (or cluster=True) for a Cluster: keys go
        through the cluster client, the subscription to the node named in the URL."""
        if url.startswith("redis+cluster://"):
            url, cluster = "redis://" + url.removeprefix("redis+cluster://"), True
        timeout_s = timeout_ms / 1000
        client: Redis | RedisCluster
        if cluster:
            client = RedisCluster.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        else:
            client = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        # No read timeout on the subscription: it is idle until someone cancels.
        subscriber = Redis.from_url(url, socket_connect_timeout=timeout_s, health_check_interval=30)
        return cls(client, subscriber, **options)

    async def start(self, deliver: Deliver) -> None:
        """Subscribe in the background, retrying with backoff while Redis is unreachable (cancels
        published meanwhile reach only the instance that runs the request). A Cluster client also
        fetches its slot map and command table now, in the background: otherwise the first request
        pays for it (tens of milliseconds, more on a busy host) before its first event."""
        self._listener = asyncio.create_task(self._listen(deliver), name="cancel-bus-listener")
        if isinstance(self._client, RedisCluster):
            self._cluster_setup = asyncio.create_task(
                self._set_up_cluster(self._client), name="cancel-bus-cluster-setup"
            )

    async def wait_subscribed(self, timeout_s: float) -> bool:
        """Whether the subscription is up, waiting for it at most `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._subscribed.wait()
        except TimeoutError:
            return False
        return True

    async def track(self, request_id: str, owner: str) -> None:
        # A store failure must not fail the request: it only loses cross-instance cancel for it.
        try:
            await self._client.set(owner_key(request_id), f"{_LIVE}\t{owner}", ex=self._ttl_s)
        except _STORE_ERRORS as exc:
            log.warning("cancel_bus_track_failed", request_id=request_id, error=type(exc).__name__)

    async def finish(self, request_id: str, owner: str) -> None:
        try:
            await self._client.set(owner_key(request_id), f"{_DONE}\t{owner}", ex=self._finished_ttl_s)
        except _STORE_ERRORS as exc:
            log.warning("cancel_bus_finish_failed", request_id=request_id, error=type(exc).__name__)

    async def cancel(self, request_id: str, user: str) -> CancelVerdict:
        try:
            record = await self._client.get(owner_key(request_id))
            if isinstance(record, bytes):
                record = record.decode()
            verdict = _verdict(record, user)
            if verdict == "cancelled":
                message = msgspec.json.encode(_CancelMessage(request_id, user))
                await self._client.publish(self._channel, message)
        except _STORE_ERRORS as exc:
            raise CancelBusUnavailable(str(exc)) from exc
        return verdict

    async def aclose(self) -> None:
        for task in (self._listener, self._cluster_setup):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._listener = self._cluster_setup = None
        await self._client.aclose()
        await self._subscriber.aclose()

    @staticmethod
    async def _set_up_cluster(client: RedisCluster) -> None:
        try:
            await client.initialize()
        except _STORE_ERRORS as exc:
            # Not fatal: the first command sets the client up again.
            log.warning("cancel_bus_cluster_setup_failed", error=type(exc).__name__)

    async def _listen(self, deliver: Deliver) -> None:
        delay_s = self._reconnect_delay_s
        while True:
            try:
                async with self._subscriber.pubsub() as pubsub:
                    await pubsub.subscribe(self._channel)
                    async for message in pubsub.listen():
                        if message["type"] == "subscribe":
                            self._subscribed.set()
                            delay_s = self._reconnect_delay_s
                        elif message["type"] == "message":
                            self._handle(deliver, message["data"])
            except (RedisError, OSError) as exc:
                # Reconnect and resubscribe, backing off while Redis stays away; what was published
                # while down is lost (a client disconnect still cancels locally).
                self._subscribed.clear()
                log.warning("cancel_bus_subscription_lost", error=type(exc).__name__, retry_in_s=delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, self._max_reconnect_delay_s)

    @staticmethod
    def _handle(deliver: Deliver, data: bytes) -> None:
        try:
            message = msgspec.json.decode(data, type=_CancelMessage)
        except msgspec.DecodeError:
            log.warning("cancel_bus_bad_message")
            return
        deliver(message.request_id, message.user)


class SharedCancelRegistry:
    """The edge's RequestRegistry for a fleet: this instance's CancelRegistry, mirrored into a bus.

    register/finish stay synchronous for the pipeline; their store writes run as tasks, the finish of
    a request after its track. `announce` waits for the track (the pipeline awaits it before the
    first event); a store failure there is logged by the bus and the request goes on, cancellable
    on this instance only. A cancel is answered locally when the request is known here, else by
    the bus, which also delivers it to the instance that runs it.
    """

    def __init__(self, local: CancelRegistry, bus: CancelBus) -> None:
        self._local = local
        self._bus = bus
        self._tracking: dict[str, asyncio.Task[None]] = {}
        self._writes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self._bus.start(self._local.cancel_local)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the store writes behind register/finish to complete."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout_s)

    async def aclose(self) -> None:
        await self.drain()
        await self._bus.aclose()

    def register(self, request_id: str, owner: str) -> LiveRequest:
        live = self._local.register(request_id, owner)
        self._tracking[request_id] = self._spawn(self._bus.track(request_id, owner))
        return live

    async def announce(self, live: LiveRequest) -> None:
        tracking = self._tracking.get(live.request_id)
        if tracking is not None:
            # Shielded: a client leaving meanwhile must not cancel the write finish() chains after.
            await asyncio.shield(tracking)

    def finish(self, live: LiveRequest) -> None:
        self._local.finish(live)
        self._spawn(self._finish(live.request_id, live.owner, self._tracking.pop(live.request_id, None)))

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        outcome = self._local.cancel_local(request_id, user)
        if outcome is not CancelOutcome.NOT_FOUND:
            return outcome
        return CancelOutcome(await self._bus.cancel(request_id, user))

    async def _finish(self, request_id: str, owner: str, tracked: asyncio.Task[None] | None) -> None:
        if tracked is not None:
            await tracked
        await self._bus.finish(request_id, owner)

    def _spawn(self, write: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task
