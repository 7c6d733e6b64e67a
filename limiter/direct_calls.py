"""The limiter's own connections, one per Redis node: every script call's round trip, on one
server or a Cluster, plain or TLS.

resp_connection.py is one such connection (a reply wakes its caller in `data_received`: one pass
of the event loop where redis-py took three). Its first version served one plain TCP server only,
and production's Redis is neither: iac/modules/redis deploys an ElastiCache Cluster with TLS
required, where every call still went through redis-py's cluster client, one call each (its
cluster pipeline refuses scripts), at 0.3-0.9 ms of CPU per decision (bench/limiter_paths.py).
Here the connections follow the client they sit beside, with redis-py's own settings for each
node (its TLS context, built by redis-py from the same options, so verification is the same;
credentials; the database): the one server a plain client names, or on a Cluster the node that
holds the user's slot (all of a user's keys share one hash tag, so one node runs the whole script).

On a Cluster the slot map is redis-py's (the client's nodes manager):
- A reply saying the slot is elsewhere or the cluster is failing over (MOVED, CLUSTERDOWN: the
  script did not run) sends that one call through redis-py, which follows the redirect and updates
  the map the next call reads.
- TRYAGAIN (a slot mid-migration, the call's keys on neither node whole: an admit's request record
  exists nowhere yet, so every admit of a migrating slot's users meets it until the slot's move
  ends) is sent again here after a short back-off, as Redis's cluster spec asks, up to
  TRYAGAIN_WAIT_S from the call's start (the whole call within its bound, first send included);
  past that the call raises SlotBusy, and that call alone is answered without Redis
  (redis_store.py), the store not taken for down. Sent through redis-py, it was retried 16
  times in 0.4 s and then raised ClusterError("TTL exhausted"), a store failure: a routine
  resharding put every user of the edge on the fallback for a backoff. A call that goes through
  redis-py all the same (a redirect's, or every call where this module cannot connect: see the
  end) still meets its 16 tries, and its "TTL exhausted" is taken for SlotBusy too
  (`through_redis_py`).
- ASK (the slot is migrating and the keys are on the importing node) is followed here: ASKING and
  the call in one write on this module's connection to that node, as Redis needs ASKING on the
  connection the call takes. redis-py sends ASKING as a command of its own on a connection of the
  node's pool and the call on the next free one, another once its pool holds two (after any two
  concurrent redirected calls): the call, taken without ASKING, was sent back (MOVED) to the
  migrating node, which said ASK again, until redis-py gave up ("TTL exhausted"): every charge and
  read of the slot's users a store failure until the migration ended.
- A node lost or refusing fails the call (the limiter's store-failure policy answers), and the
  next call first reloads the map from the cluster: after a failover it finds the new primary.
- A connection that stops answering without closing (a host gone without a reset) is closed when
  a reply on it is owed longer than a call's bound (resp_connection.py), as redis-py drops a
  connection that timed out; else it would hold every later call of its node until the kernel gave
  up on it, many minutes on. The next call opens a new one, on a Cluster after reloading the map.

Each call is bounded without a timer of its own on the way every call takes (an open connection:
its reply's deadline is the connection's); the rest (opening a connection, reloading the slot map,
a call that goes through redis-py) runs under one deadline for all of it, as every call did before.
Both are the limiter's bound on a call (RedisLimiter: the connect timeout and three answer
timeouts, 1.75 s by the edge's defaults), not the answer timeout alone: a reply can sit unread
while this process's loop is busy (a burst of stream set-ups, a collection), and uvloop runs its
timers before it reads the sockets, so a deadline that short would take a busy edge for a dead
Redis.

Unix sockets and credential providers stay on redis-py's path (None from `for_client`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import Connection, SSLConnection
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from limiter.metrics import CLUSTER_REDIRECTS, CONNECTIONS_OPENED, SLOT_MAP_RELOADS, STALLED_CLOSED
from limiter.pipelined_replies import replies_loading_once
from limiter.resp import pack_command, pack_evalshas
from limiter.resp_connection import RespConnection, open_connection

# Error replies a Cluster node gives before running anything: the call belongs elsewhere (MOVED,
# ASK) or not now (CLUSTERDOWN during a failover; TRYAGAIN, handled apart, during a slot's migration).
_REDIRECTS = ("MOVED ", "ASK ", "CLUSTERDOWN")
_ASKING = pack_command("ASKING")
# How long from its start a call its slot answers TRYAGAIN is sent again (at most half its bound), and
# the pauses (doubling from the first to the longest): a slot of a few hundred keys moves in
# milliseconds, and an admit waits no longer than this for a slot that takes longer.
TRYAGAIN_WAIT_S = 0.5
_TRYAGAIN_FIRST_PAUSE_S = 0.005
_TRYAGAIN_LONGEST_PAUSE_S = 0.1


class _TryAgain(Exception):
    """A node answered TRYAGAIN: the script did not run."""


# redis-py's cluster client gives up on a call with this ClusterError after RedisClusterRequestTTL
# (16) replies that each sent it elsewhere or asked it to wait (MOVED, ASK, TRYAGAIN).
_TTL_EXHAUSTED = "TTL exhausted"


class SlotBusy(Exception):
    """The slot kept answering TRYAGAIN (mid-migration) past TRYAGAIN_WAIT_S: one slot's users are
    briefly out of reach, not the store. `ran_none`: no call of the batch ran (False where other
    calls sent with it may have)."""

    def __init__(self, message: str, *, ran_none: bool = True) -> None:
        super().__init__(message)
        self.ran_none = ran_none


async def through_redis_py(script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]) -> Any:
    """The script called through redis-py; its giving up on a slot that kept answering TRYAGAIN
    raised as SlotBusy, as this module's own retries end.

    redis-py (asyncio/cluster.py `_execute_command`) retries TRYAGAIN, MOVED and ASK itself, up to
    16 replies, and then raises a bare ClusterError("TTL exhausted."), with no cause attached: which
    of the three it met cannot be told. It can be told from the store failing, which is all that
    matters here: every one of those replies came from a node that answered and ran nothing (a
    connection lost or timed out, or CLUSTERDOWN, which is a ClusterError too, is raised as
    itself). Such a call is a slot in motion (a migration's TRYAGAIN, or ASK and MOVED
    sending it between the two nodes of a migrating slot), one slot's users out of reach for now,
    not the store. Taken for a store failure, it put the whole edge on the fallback for a backoff.
    TryAgainError itself is never raised by the installed redis-py (it retries it), but it means
    the same wherever one would be."""
    try:
        return await script(keys=keys, args=args)
    except TryAgainError as exc:
        raise SlotBusy(str(exc)) from exc
    except ClusterError as exc:
        if isinstance(exc, ClusterDownError) or _TTL_EXHAUSTED not in str(exc):
            raise
        raise SlotBusy(str(exc)) from exc


@dataclass(frozen=True)
class Endpoint:
    """One node as redis-py would reach it."""

    host: str
    port: int
    tls: ssl.SSLContext | None
    username: str | None
    password: str | None
    db: int

    @classmethod
    def of(cls, connection_class: type, kwargs: dict[str, Any]) -> Endpoint | None:
        """From a pool's or cluster node's connection class and options; None where this module
        cannot connect as redis-py would."""
        if not _reachable(connection_class, kwargs):
            return None
        if connection_class is SSLConnection:
            # redis-py's own context for these options (CA, verification, hostname check, client
            # certificate): constructing the connection opens nothing.
            tls: ssl.SSLContext | None = SSLConnection(**kwargs).ssl_context.get()
        else:
            tls = None
        return cls(
            host=kwargs.get("host", "localhost"),
            port=int(kwargs.get("port", 6379)),
            tls=tls,
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            db=int(kwargs.get("db", 0) or 0),
        )


def _leave_if_demoted(conn: RespConnection, replies: Sequence[Any]) -> None:
    """Close `conn` when a reply says its server is a replica now (READONLY): a standalone primary
    failed over behind its endpoint's name (ElastiCache without cluster mode, Sentinel) keeps the
    connections opened before, and answered every script READONLY on them for good, the store taken
    for down (every probe on the same connection) until the edge restarted. The next call opens a
    new connection, to whatever the name leads to now."""
    if any(isinstance(reply, ReadOnlyError) for reply in replies):
        conn.close()


def _reachable(connection_class: type, kwargs: dict[str, Any]) -> bool:
    """TCP, plain or TLS, with a fixed password if any (not a Unix socket or a credential provider)."""
    return connection_class in (Connection, SSLConnection) and kwargs.get("credential_provider") is None


class DirectCalls:
    """Script calls, each on the connection to the node that runs it."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        connect_timeout_s: float,
        single: Endpoint | None,
        bound_s: float,
    ) -> None:
        """`bound_s`: how long a call may take, a reply owed on an open connection or the slow way
        all told."""
        self._client = client
        self._loads: dict[str, bytes] = {}  # a script's SHA: its SCRIPT LOAD, packed
        self._connect_timeout_s = connect_timeout_s
        self._bound_s = bound_s
        self._single = single  # the one server, when the client is not a Cluster
        self._endpoints: dict[str, Endpoint | None] = {}  # a cluster node's name: how to reach it
        self._conns: dict[tuple[str, int], RespConnection] = {}
        # One opening at a time per node (concurrent first calls share it); a node slow to answer
        # a connect delays no other node's.
        self._opening: dict[tuple[str, int], asyncio.Lock] = {}
        self._reloading = asyncio.Lock()
        self._reload_slots = False
        # Connections the server or the network ended. A Redis restarted between two calls is
        # noticed only here: no call failed, yet it may have come back empty (redis_store.py's
        # restore then runs before the next admit).
        self.lost = 0

    @classmethod
    def for_client(
        cls, client: Redis | RedisCluster, connect_timeout_s: float, bound_s: float
    ) -> DirectCalls | None:
        if isinstance(client, RedisCluster):
            kwargs = client.nodes_manager.connection_kwargs
            if not _reachable(kwargs.get("connection_class", Connection), kwargs):
                return None
            return cls(client, connect_timeout_s, None, bound_s)
        pool = client.connection_pool
        single = Endpoint.of(pool.connection_class, dict(pool.connection_kwargs))
        return None if single is None else cls(client, connect_timeout_s, single, bound_s)

    async def call(self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """The script's reply; an error reply is raised, so is TimeoutError for a reply owed too long.
        NOSCRIPT (a restarted node): load it there and send again, it did not run. TRYAGAIN: sent
        again after a pause, SlotBusy once TRYAGAIN_WAIT_S from the call's start would be over.

        The whole call, first send included, stays within the bound: sends again stop at
        TRYAGAIN_WAIT_S or half the bound from the start, whichever comes first (the other half
        left for the last one's reply), and each runs under what is left of the bound. Timed from
        the first TRYAGAIN, an admit whose first send was slow (a connect, a slot map reload) took
        that long on top, past the bound the limiter promises its callers."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            return await self._call_once(script, keys, args)
        except _TryAgain as exc:
            busy = str(exc)
        resend_until = started + min(TRYAGAIN_WAIT_S, self._bound_s / 2)
        pause = _TRYAGAIN_FIRST_PAUSE_S
        async with asyncio.timeout_at(started + self._bound_s):
            while (now := loop.time()) < resend_until:
                await asyncio.sleep(min(pause, resend_until - now))
                pause = min(2 * pause, _TRYAGAIN_LONGEST_PAUSE_S)
                try:
                    return await self._call_once(script, keys, args)
                except _TryAgain as exc:
                    busy = str(exc)
        raise SlotBusy(busy)

    async def _call_once(self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        conn = self._open_for(keys[0])
        if conn is not None:
            return await self._send(conn, script, keys, args)
        async with asyncio.timeout(self._bound_s):
            try:
                conn = await self._connection(keys[0])
            except RedisConnectionError:
                self._reload_slots = self._single is None
                raise
            except SlotNotCoveredError:
                conn = None  # the map has a hole (a failover under way): redis-py reloads it and retries
            if conn is None:  # or a cluster node this module cannot reach as redis-py would
                return await through_redis_py(script, keys, args)
            return await self._send(conn, script, keys, args)

    def _open_for(self, key: str) -> RespConnection | None:
        """The open connection to the node holding `key`, when there is one and the slot map needs
        no reload: found without waiting for anything."""
        if self._single is not None:
            endpoint: Endpoint | None = self._single
        elif self._reload_slots:
            return None
        else:
            assert isinstance(self._client, RedisCluster)
            try:
                node = self._client.get_node_from_key(key)
            except SlotNotCoveredError:
                return None
            endpoint = None if node is None else self._endpoint_of(node)
        conn = None if endpoint is None else self._conns.get((endpoint.host, endpoint.port))
        return conn if conn is not None and conn.usable() else None

    async def _send(
        self,
        conn: RespConnection,
        script: AsyncScript,
        keys: Sequence[str],
        args: Sequence[str | int],
        *,
        asking: bool = False,
    ) -> Any:
        """`asking`: `conn` is to the node an ASK named; the call goes right behind ASKING, in one
        write (no other caller's command between them). A redirect from there goes through redis-py."""
        packed = pack_evalshas(script.sha, [(keys, args)])
        if asking:
            packed = _ASKING + packed
        try:
            reply = await self._reply(conn, packed, asking)
            if isinstance(reply, NoScriptError):
                loaded = await conn.send(self._load(script))
                if isinstance(loaded, Exception):
                    raise loaded
                reply = await self._reply(conn, packed, asking)
        except RedisConnectionError:
            self._reload_slots = self._single is None
            raise
        except TimeoutError:
            # The connection closed itself (its reply owed too long): the node may be gone for good.
            STALLED_CLOSED.inc()
            self._reload_slots = self._single is None
            raise
        if isinstance(reply, ReadOnlyError):
            conn.close()  # its server is a replica now (_leave_if_demoted)
        if isinstance(reply, ResponseError) and str(reply).startswith("ASK ") and not asking:
            CLUSTER_REDIRECTS.labels(reply="ASK").inc()
            async with asyncio.timeout(self._bound_s):
                importing = await self._asked(str(reply))
                if importing is None:  # a node the map does not know yet, or one reached as redis-py would
                    return await through_redis_py(script, keys, args)
            return await self._send(importing, script, keys, args, asking=True)
        if isinstance(reply, ResponseError) and str(reply).startswith("TRYAGAIN"):
            CLUSTER_REDIRECTS.labels(reply="TRYAGAIN").inc()
            raise _TryAgain(str(reply))
        if isinstance(reply, ResponseError) and str(reply).startswith(_REDIRECTS):
            CLUSTER_REDIRECTS.labels(reply=str(reply).split(" ", 1)[0]).inc()
            async with asyncio.timeout(self._bound_s):
                return await through_redis_py(script, keys, args)
        if isinstance(reply, Exception):
            raise reply
        return reply

    @staticmethod
    async def _reply(conn: RespConnection, packed: bytes, asking: bool) -> Any:
        """The call's reply: with `asking`, the second of the two (ASKING's is OK)."""
        if not asking:
            return await conn.send(packed)
        return (await asyncio.gather(*conn.send_many(packed, 2)))[1]

    async def _asked(self, reply: str) -> RespConnection | None:
        """The connection to the node an ASK reply (`ASK <slot> <host>:<port>`) names, None where
        the slot map knows no such node or this module cannot reach it as redis-py would."""
        assert isinstance(self._client, RedisCluster)
        host, _, port = reply.split(" ", 2)[2].rpartition(":")
        host, port_number = self._client.nodes_manager.remap_host_port(host, int(port))
        node = self._client.get_node(host, port_number)
        endpoint = None if node is None else self._endpoint_of(node)
        if endpoint is None:
            return None
        try:
            return await self._connected(endpoint)
        except RedisConnectionError:
            self._reload_slots = True  # as for any node lost: the map first, next call
            raise

    async def call_all(
        self, script: AsyncScript, calls: Sequence[tuple[Sequence[str], Sequence[str | int]]]
    ) -> list[Any]:
        """Many calls of a script, each still one atomic run; their replies in order, the first
        error reply raised. On one server all in one write (a pipeline); on a Cluster each on its
        node's connection (those of one pass share a write)."""
        if self._single is None:
            try:
                return list(await asyncio.gather(*(self.call(script, keys, args) for keys, args in calls)))
            except SlotBusy as exc:
                if len(calls) == 1:
                    raise
                # The batch's other calls, on other slots, may have run.
                raise SlotBusy(str(exc), ran_none=False) from exc
        conn = await self._connection("")
        assert conn is not None  # one server: always its endpoint

        async def send(batch: Sequence[tuple[Sequence[str], Sequence[str | int]]]) -> list[Any]:
            answers = conn.send_many(pack_evalshas(script.sha, batch), len(batch))
            replies = list(await asyncio.gather(*answers))
            _leave_if_demoted(conn, replies)
            return replies

        async def load() -> None:
            loaded = await conn.send(self._load(script))
            if isinstance(loaded, Exception):
                raise loaded

        return await replies_loading_once(send, load, script.sha, calls)

    def _load(self, script: AsyncScript) -> bytes:
        packed = self._loads.get(script.sha)
        if packed is None:
            text = script.script
            source = text if isinstance(text, str) else bytes(text).decode()
            packed = self._loads[script.sha] = pack_command("SCRIPT", "LOAD", source)
        return packed

    async def open_all(self) -> None:
        """Every node's connection now (a Cluster's primaries, its slot map first) rather than on
        each node's first call: a new edge's first requests pay no connect or TLS handshake."""
        if self._single is not None:
            await self._connected(self._single)
            return
        assert isinstance(self._client, RedisCluster)
        await self._client.initialize()
        for node in self._client.get_primaries():
            if (endpoint := self._endpoint_of(node)) is not None:
                await self._connected(endpoint)

    async def _connection(self, key: str) -> RespConnection | None:
        endpoint = self._single if self._single is not None else await self._node_for(key)
        return None if endpoint is None else await self._connected(endpoint)

    async def _connected(self, endpoint: Endpoint) -> RespConnection:
        address = (endpoint.host, endpoint.port)
        conn = self._conns.get(address)
        if conn is not None and conn.usable():
            return conn
        async with self._opening.setdefault(address, asyncio.Lock()):
            conn = self._conns.get(address)
            if conn is None or not conn.usable():
                conn = self._conns[address] = await open_connection(
                    endpoint.host,
                    endpoint.port,
                    tls=endpoint.tls,
                    username=endpoint.username,
                    password=endpoint.password,
                    db=endpoint.db,
                    timeout_s=self._connect_timeout_s,
                    answer_timeout_s=self._bound_s,
                    on_lost=self._count_lost,
                )
                CONNECTIONS_OPENED.inc()
        return conn

    def _count_lost(self) -> None:
        self.lost += 1

    async def _node_for(self, key: str) -> Endpoint | None:
        assert isinstance(self._client, RedisCluster)
        if self._reload_slots:
            async with self._reloading:
                if self._reload_slots:
                    # Bounded by the deadline around us (`call`); on failure the flag stays.
                    await self._client.nodes_manager.initialize()
                    SLOT_MAP_RELOADS.inc()
                    self._reload_slots = False
                    self._endpoints.clear()
        node = self._client.get_node_from_key(key)
        return None if node is None else self._endpoint_of(node)

    def _endpoint_of(self, node: ClusterNode) -> Endpoint | None:
        try:
            return self._endpoints[node.name]
        except KeyError:
            endpoint = self._endpoints[node.name] = Endpoint.of(node.connection_class, node.connection_kwargs)
            return endpoint

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
