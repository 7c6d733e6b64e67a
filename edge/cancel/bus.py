"""Cancel across edge instances: who runs a request, and a broadcast that reaches whoever runs it.

A request's stream lives on one edge instance; its cancel may arrive at any of them. `cancel`
finds the request live in the store, marks it cancelled and publishes the cancel; every instance
is subscribed and hands it to `deliver(request_id, user)`, which stops the stream if that instance
holds it.

Live is what the limiter already writes: an admitted request holds a slot in its user's
concurrency set (`fg:{<user>}:conc`, limiter/redis_store.py) from the admit, which completes before
the client can know the id, to its settle; and the limiter keeps a record per request
(`limiter.redis_store.record_key`, in the same Cluster slot), which its settle marks "done", or
"done:cancelled" when a cancel ended it. A cancel marks that record "cancelled". So a stream costs
the cancel machinery no write of its own: neither when it starts nor when it ends (the settle that
frees its slot answers for it, and records a cancel its own instance answered). The user
in the keys answers another user's id and an unknown one alike (NOT_FOUND). Cancels go over
classic pub/sub, which a Redis Cluster broadcasts to every node.

The contract between a cancel and a generation ending on its own (edge/cancel/live.py) holds
across instances too, decided in the store: a cancel marks a live request `cancelled` (one script:
check and mark), and the instance that runs it, once its generation stops running, settles it,
which marks it `done` and learns in the same script whether a cancel came first
(limiter/scripts/settle.lua). So a cancel answered CANCELLED anywhere always ends the stream
cancelled, and one after the settle answers FINISHED, or CANCELLED again for a request a cancel
ended, on whichever instance it ran (idempotent, as edge/cancel/live.py; while the record lasts:
the slot's lease TTL, then NOT_FOUND).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec
import structlog
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from edge.cancel.outcome import CancelOutcome
from edge.primary_publish import PRIMARY_CHECK_KEY, check_refused, primary_publisher
from edge.redis_subscription import PRIMARY_ID_SCRIPT, ServerId, Subscription
from edge.task_stop import stop_task
from limiter import redis_url
from limiter.redis_store import record_key, user_keys

log = structlog.get_logger("floodgate.cancel_bus")

Deliver = Callable[[str, str], object]  # (request_id, user): stop that stream if held here
Running = Callable[[], Iterable[tuple[str, str]]]  # (request_id, user) of each request running here

CHANNEL = "floodgate:cancel"
# The cancel script's answer for a request a cancel ended: CANCELLED, not broadcast.
_ENDED_CANCELLED = "ended_cancelled"

# Cancel: a request the limiter holds a slot for, not yet settled, is marked "cancelled". A slot
# past its lease (its score, in Redis TIME microseconds) is no stream's: its instance stopped
# charging, which renews the lease, because it died; the limiter's next admit of that user drops
# it. Until then a cancel of it answered "cancelled" for a stream nobody runs.
# A request a cancel ended (settled 'done:cancelled') answers "cancelled" again with nothing to
# broadcast: nobody runs it.
# It starts with a write that changes nothing (a ZREM of a member no admit adds, on the key and
# with the command the limiter's settle uses, so whoever may settle may run it): a connection left
# on a primary demoted behind its endpoint (edge/primary_publish.py) is refused READONLY before the
# reads, and sent again to the new primary. The reads alone answered there, from a server behind
# the new primary: not_found for a request admitted since the failover, a 404 while its stream ran,
# for as long as no cancel that marks came along to close the connection.
# KEYS: the request's record, its user's concurrency set. ARGV: request id, the mark's TTL.
# (Public for bench/redis_call_cost.py, which times it.)
CANCEL_SCRIPT = """
redis.call('ZREM', KEYS[2], '')
local state = redis.call('GET', KEYS[1])
if state == 'cancelled' then return 'cancelled' end
if state == 'done:cancelled' then return 'ended_cancelled' end
if state then return 'finished' end
local lease_ends = redis.call('ZSCORE', KEYS[2], ARGV[1])
local t = redis.call('TIME')
if not lease_ends or tonumber(lease_ends) <= tonumber(t[1]) * 1000000 + tonumber(t[2]) then
  return 'not_found'
end
redis.call('SET', KEYS[1], 'cancelled', 'EX', ARGV[2])
return 'cancelled'
"""

# A look-up of the cancels missed that read another server than the subscription's is made again,
# this many times in all, each after dropping the idle pooled connections (they reconnect through
# the endpoint) and waiting twice as long as the last, from _RECONCILE_RETRY_S: a failover's window
# closes in moments, and a hot loop would only load the server.
_RECONCILE_TRIES = 5
_RECONCILE_RETRY_S = 0.1

# What a store that is down or unsettled raises. redis-py's cluster client raises
# RedisClusterException (not a RedisError) when no node answers or a slot is not covered.
_STORE_ERRORS = (RedisError, RedisClusterException)


class CancelBusUnavailable(Exception):
    """The shared store could not be asked: answer 503, the request may still be running."""


def _no_requests() -> Iterable[tuple[str, str]]:
    return ()


class CancelBus(Protocol):
    async def start(self, deliver: Deliver, running: Running = _no_requests) -> None:
        """Subscribe: once subscribed, deliver() is called for every cancel any instance publishes,
        and for each of `running` (this instance's requests) the store marked cancelled while the
        subscription was away. Returns without waiting for a store that is down (start-up must not
        hang on it)."""
        ...

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        """If `user`'s request is live (holds its limiter slot), mark it cancelled and broadcast
        the cancel. Another user's id answers as an unknown one: NOT_FOUND."""
        ...

    async def aclose(self) -> None: ...


class _CancelMessage(msgspec.Struct, frozen=True):
    request_id: str
    user: str


class RedisCancelBus:
    def __init__(
        self,
        client: Redis | RedisCluster,
        subscriber: Redis,
        *,
        ttl_s: int = 3600,  # a cancelled record's (its stream's settle replaces it)
        channel: str = CHANNEL,
        reconnect_delay_s: float = 0.5,
        max_reconnect_delay_s: float = 10.0,
        idle_ping_s: float = 5.0,  # a silent subscription link is found within both
        pong_timeout_s: float = 5.0,
        primary_check_s: float | None = 5.0,  # None for a Cluster (edge/redis_subscription.py)
        timeout_s: float | None = None,  # the client's: the longest a cancel's call waits for Redis
    ) -> None:
        """`timeout_s` bounds each of a cancel's calls (its script, its publish) however the
        client retries: a Redis Cluster client's retries (a topology refresh, the node again) held
        a cancel four to eight of its timeouts on a cluster that went silent, against one for a
        plain client."""
        self._client = client
        self._timeout_s = timeout_s
        self._ttl_s = ttl_s
        self._channel = channel
        self._subscription = Subscription(
            subscriber,
            channel,
            name="cancel_bus",
            delay_s=reconnect_delay_s,
            max_delay_s=max_reconnect_delay_s,
            idle_ping_s=idle_ping_s,
            pong_timeout_s=pong_timeout_s,
            primary_check_s=primary_check_s,
        )
        self._cluster_setup: asyncio.Task[None] | None = None
        self._reconcile: asyncio.Task[None] | None = None
        # EVALSHA, the script's body loaded once (redis-py loads it again after a NOSCRIPT).
        self._cancel_script = client.register_script(CANCEL_SCRIPT)
        self._publish = primary_publisher(client)

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
        subscriber = redis_url.connect_node(
            url, socket_connect_timeout=timeout_s, health_check_interval=30, socket_keepalive=True
        )
        if redis_url.is_cluster(url, cluster=cluster):
            options.setdefault("primary_check_s", None)
        options.setdefault("timeout_s", timeout_s)
        return cls(client, subscriber, **options)

    async def start(self, deliver: Deliver, running: Running = _no_requests) -> None:
        """Subscribe in the background, retrying with backoff while Redis is unreachable. A cancel
        published meanwhile reaches no instance, but the store has marked the request's record: on
        every (re)subscription the records of the requests `running` here are read, and those
        marked cancelled delivered. A Cluster client also fetches its slot map and command table
        now, in the background: otherwise the first cancel pays for it (tens of milliseconds, more
        on a busy host)."""

        def subscribed(server: ServerId | None) -> None:
            # A lookup still under way began before this subscription: its answers may predate a
            # mark whose publish this subscription missed, so it starts over.
            if self._reconcile is not None:
                self._reconcile.cancel()
            self._reconcile = asyncio.create_task(
                self._deliver_missed(deliver, running, server), name="cancel-bus-reconcile"
            )

        self._subscription.start(lambda data: self._handle(deliver, data), subscribed)
        if isinstance(self._client, RedisCluster):
            self._cluster_setup = asyncio.create_task(
                self._set_up_cluster(self._client), name="cancel-bus-cluster-setup"
            )

    async def wait_subscribed(self, timeout_s: float) -> bool:
        """Whether the subscription is up, waiting for it at most `timeout_s`."""
        return await self._subscription.wait_subscribed(timeout_s)

    async def cancel(self, request_id: str, user: str) -> CancelOutcome:
        try:
            _, _, slots = user_keys(user)
            keys = [record_key(user, request_id), slots]
            async with asyncio.timeout(self._timeout_s):
                answer = await self._cancel_script(keys=keys, args=[request_id, self._ttl_s])
            text = answer.decode() if isinstance(answer, bytes) else answer
            if text == _ENDED_CANCELLED:
                return CancelOutcome.CANCELLED
            outcome = CancelOutcome(text)
            if outcome is CancelOutcome.CANCELLED:
                message = msgspec.json.encode(_CancelMessage(request_id, user))
                async with asyncio.timeout(self._timeout_s):
                    await self._publish(self._channel, message)
        except (*_STORE_ERRORS, TimeoutError) as exc:
            raise CancelBusUnavailable(str(exc) or "no answer from Redis in time") from exc
        return outcome

    async def aclose(self) -> None:
        if self._reconcile is not None:
            await stop_task(self._reconcile)
            self._reconcile = None
        if self._cluster_setup is not None:
            await stop_task(self._cluster_setup)
            self._cluster_setup = None
        await self._subscription.aclose()
        await self._client.aclose()

    async def _deliver_missed(self, deliver: Deliver, running: Running, server: ServerId | None) -> None:
        """Deliver the cancels of requests running here that the store marked while the
        subscription was away. Read after the subscription is up, so a cancel marked later is
        heard on the channel. (Every running request's record is read: one pipelined round trip
        per batch, on each reconnect only.) Read on `server`, the one the subscription is on (its
        run id; None where the subscription is unchecked: then on a primary): after a failover the
        subscription moved to the new primary (edge/redis_subscription.py), while a pooled
        connection may still be on the old one. Demoted, it refuses the read's no-op write and the
        read goes again on a new connection; still a primary (the failover's window), it refuses
        nothing and has no mark made since, and the cancel was lost: a read on another server than
        `server` is made again on new connections (_RECONCILE_TRIES)."""
        requests = list(running())
        on_primary = not isinstance(self._client, RedisCluster)  # a Cluster client asks primaries
        batch = 500
        for start in range(0, len(requests), batch):
            chunk = requests[start : start + batch]
            tries = 0
            while True:
                try:
                    states, read_on = await self._read_records(
                        chunk, on_primary=on_primary, identify=on_primary and server is not None
                    )
                except _STORE_ERRORS as exc:
                    if on_primary and check_refused(exc):
                        # An ACL without PERSIST, INFO or its key: read them unchecked, as before
                        # the check, rather than never (the cancels missed never stopped their
                        # streams).
                        log.warning("cancel_bus_reconcile_check_refused", error=type(exc).__name__)
                        on_primary = False
                        continue
                    # The subscription is likely breaking too; its resubscription looks again.
                    log.warning("cancel_bus_reconcile_failed", error=type(exc).__name__)
                    return
                # A mark read anywhere is a cancel (delivering one twice is harmless): delivered
                # even from another server, which may hold marks the subscription's lacks.
                for (request_id, user), state in zip(chunk, states, strict=True):
                    if state in (b"cancelled", "cancelled"):
                        deliver(request_id, user)
                tries += 1
                if read_on is None or server is None or _same_server(read_on, server):
                    break
                if tries == _RECONCILE_TRIES:
                    # The endpoint leads elsewhere than the subscription: its primary check moves
                    # it there, and that subscription looks again.
                    log.warning("cancel_bus_reconcile_off_subscription_server", read_on=str(read_on))
                    return
                # Connections in use stay: whoever holds them hands them back, and the next try
                # drops them then if they are still on that server.
                assert isinstance(self._client, Redis)  # a Cluster client's reads name no server
                await self._client.connection_pool.disconnect(inuse_connections=False)
                await asyncio.sleep(_RECONCILE_RETRY_S * 2 ** (tries - 1))

    async def _read_records(
        self, chunk: list[tuple[str, str]], *, on_primary: bool, identify: bool
    ) -> tuple[list[Any], ServerId | None]:
        """The records of `chunk`'s requests, read on a primary when `on_primary`, and the run id
        of the server read when `identify` too (else None)."""
        pipe = self._client.pipeline(transaction=False)
        if on_primary:
            # A write that changes nothing first: a demoted primary, behind the new one, answers
            # READONLY and the reads go again on a new connection (redis_url.connect_node).
            if identify:
                # EVAL, not a registered script: no SCRIPT EXISTS round trip before the pipeline.
                pipe.eval(PRIMARY_ID_SCRIPT, 1, PRIMARY_CHECK_KEY)
            else:
                pipe.persist(PRIMARY_CHECK_KEY)
        for request_id, user in chunk:
            pipe.get(record_key(user, request_id))
        states: list[Any] = await pipe.execute()
        if not on_primary:
            return states, None
        return states[1:], states[0] if identify else None

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


def _same_server(run_id: ServerId, other: ServerId) -> bool:
    """Whether two run ids, as bytes or str (a client may decode its replies or not), name the
    same server."""
    text = run_id.decode() if isinstance(run_id, bytes) else run_id
    return text == (other.decode() if isinstance(other, bytes) else other)
