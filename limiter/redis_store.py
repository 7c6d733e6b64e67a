"""The shared limiter: one atomic Lua step per decision on Redis (standalone or Cluster).

Scripts are called by SHA and loaded again when Redis answers NOSCRIPT, so a restarted or
failed-over Redis needs nothing from us. When Redis fails the tier's `on_store_failure` applies:
"open" answers from a local twin whose limits are divided by the number of edge instances,
"closed" raises StoreUnavailable. After a failure the store is left alone for a short backoff
(store_health.py), then tried again: recovery needs no restart.

Slow is not down, and a late answer is not a "no":
- Waiting for a free connection (the pool is busy, or the first connections are still being
  opened) has its own bound (`pool_wait_s`) and never marks the store down; only a store that
  does not answer within `timeout_ms` does.
- A call that timed out may still run on Redis afterwards. redis-py's own retries are off (a
  re-sent script would count twice), the scripts are idempotent per request id (admit answers a
  request holding its slot "allowed" again at no cost; settle marks the request's record done,
  which a late admit respects), and an admit whose answer never came is undone on Redis (a
  settle) unless the request runs.
- The local twin mirrors every decision Redis made for this instance, so the fail-open fallback
  continues from what this instance really admitted instead of from an empty state: it never
  lets one instance exceed its share of the tier (limit / instance count) on top of that.
- After an outage each instance puts back what it counted (restore.lua), and N instances'
  fallbacks add up there: what each admitted alone (the twin's ledger) is added to what Redis
  holds, once per ledger however often the restore is sent; a Redis restarted empty also gets
  back this instance's whole count. The later of the instances' TATs kept one fallback's only.
- A busy pool (no free connection within `pool_wait_s`) is answered by the fallback too, as the
  bound on a caller's wait promises, but Redis lost nothing then: the restore that follows puts
  back the fallback's ledgers alone, not every user's whole count as after an outage.
- A restore runs in the background once Redis answers: an admit meanwhile (the probe's among them)
  puts back its own user's count first and goes on, rather than waiting for every user's
  (`_restored_for`).
- Settles go through a queue that batches them into one round trip and retries them until they
  land or their slot expires (settle_queue.py): a Redis stall never leaks a slot.
- A crashed edge instance cannot settle: the fleet names it departed (edge/membership/), and admit
  frees its slots when they would refuse a user (`free_slots_of`), not a slot TTL later.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Literal, Protocol

import structlog
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from limiter import policy, redis_url
from limiter.base import Admission, Decision, LimitName, StoreUnavailable, TierLimits
from limiter.call_batcher import CallBatcher
from limiter.direct_calls import DirectCalls, SlotBusy, through_redis_py
from limiter.lease import admission
from limiter.memory import DEFAULT_BATCH_TOKENS, DEFAULT_LEASE_TTL_S, LedgerSnapshot, MemoryLimiter
from limiter.metrics import SLOT_BUSY, STORE_BUSY
from limiter.pipelined_replies import replies_loading_once
from limiter.reads import ReadDecision, read_rates
from limiter.resp import pack_evalshas
from limiter.scripts import script_text
from limiter.settle_queue import PendingSettle, SettleQueue
from limiter.store_health import StoreHealth
from limiter.stream_ends import StreamEnds
from limiter.tiers import per_instance

log = structlog.get_logger("limiter")

DEFAULT_BACKOFF_S = 1.0
# In-flight store calls per limiter. redis-py's pools raise instead of waiting when exhausted, so
# the limiter queues callers itself; one call takes well under a millisecond on Redis.
DEFAULT_MAX_CONNECTIONS = 64
# How long a call may wait for one of those connections: a busy pool is not a failed store.
DEFAULT_POOL_WAIT_S = 2.0
# Opening a connection is not an answer from a busy server either: its own, longer bound.
DEFAULT_CONNECT_TIMEOUT_S = 1.0
_CLUSTER_CONCURRENCY = 16
# Budgets a restore puts back per round trip (`_resync`): each round trip is one bounded call, well
# within the bound (about 40 µs a budget on Redis and here: 20 ms), and the loop runs between them.
RESTORE_CHUNK = 500
_LIMIT_NAMES: dict[int, LimitName] = {1: "requests", 2: "tokens", 3: "concurrency"}
Op = Literal["admit", "charge", "settle", "restore", "read"]


class _ScriptCall(Protocol):
    """One script's call (RedisLimiter._way): its reply, or _NotSent / _NoAnswer."""

    def __call__(
        self, keys: Sequence[str], args: Sequence[str | int], epoch: int | None = None
    ) -> Awaitable[Any]: ...


class _NotSent(Exception):
    """The call never reached Redis (backoff, no free connection, connection refused): nothing
    can have run there."""


class _NoAnswer(Exception):
    """Redis did not answer in time or the connection broke mid-call: the script may have run."""


def _user_prefix(user: str) -> str:
    """`fg:{user}`: the hash tag puts all the user's keys in one Cluster slot. A name with a "}" (or
    none) would end the tag early or leave it empty, and an empty tag makes Redis hash each key
    whole: every script on them failed CROSSSLOT, read as the store failing for every user. Such a
    name's tag is a digest instead, the name kept after it so that distinct names keep distinct
    keys (a digest shared with another name's tag only shares a slot)."""
    if user and "}" not in user:
        return f"fg:{{{user}}}"
    digest = hashlib.blake2b(user.encode(), digest_size=12).hexdigest()
    return f"fg:{{#{digest}}}{user}"


def _budget(prefix: str, tier: str) -> str:
    """Where the keys of a user's budgets in `tier` start (the unnamed tier's: the user's own)."""
    return f"{prefix}:{tier}" if tier else prefix


def user_keys(user: str, tier: str = "") -> tuple[str, str, str]:
    """The user's budgets in `tier` (requests, tokens: each tier its own, TierLimits.name) and its
    concurrency set (one across tiers), in one Cluster slot."""
    prefix = _user_prefix(user)
    budget = _budget(prefix, tier)
    return f"{budget}:req", f"{budget}:tok", f"{prefix}:conc"


def read_key(user: str, tier: str = "") -> str:
    """The user's history-read budget in `tier` (limiter/reads.py), in the user's Cluster slot."""
    return f"{_budget(_user_prefix(user), tier)}:read"


def admit_keys(user: str, tier: str, request_id: str) -> tuple[str, ...]:
    """admit.lua's keys: the user's keys in `tier`, the request's record and, for a named tier,
    the user's budgets as kept before they were per tier and the mark of the tier they seeded."""
    prefix = _user_prefix(user)
    if not tier:
        return f"{prefix}:req", f"{prefix}:tok", f"{prefix}:conc", f"{prefix}:done:{request_id}"
    budget = _budget(prefix, tier)
    return (
        f"{budget}:req",
        f"{budget}:tok",
        f"{prefix}:conc",
        f"{prefix}:done:{request_id}",
        f"{prefix}:req",
        f"{prefix}:tok",
        f"{prefix}:seeded",
    )


def record_key(user: str, request_id: str) -> str:
    """The request's record (same hash tag as the user's keys): absent while it runs, "cancelled"
    once the fleet's cancel marked it running (edge/cancel/bus.py), from its settle on
    "done:cancelled" when a cancel ended it (marked so, or cancelled on its own instance) and "done"
    when it ended on its own: a cancel repeated on any instance answers as the first did."""
    return f"{_user_prefix(user)}:done:{request_id}"


def restore_call(
    user: str,
    tier: str,
    snap: policy.Snapshot,
    ledger: LedgerSnapshot | None,
    *,
    instance: str,
    instance_count: int,
    lease_ttl_us: int,
    now_arg: str = "",
) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
    """restore.lua's keys and arguments for one user's budgets in one tier: the twin's snapshot
    (this instance's whole count), its ledger (what its fallback counted alone since Redis last took
    it) and the user's running requests. The ledger's key names the tier, this instance and the
    ledger's generation, so that only a retry of the same ledger finds what was added before (same
    hash tag as the user's keys)."""
    generation = 0 if ledger is None else ledger.generation
    budget = _budget(_user_prefix(user), tier)
    keys = (
        *user_keys(user, tier),
        f"{budget}:ledger:{instance}:{generation}",
        *(record_key(user, request_id) for request_id in snap.request_ids),
    )
    if ledger is None:
        ledger_args: tuple[int | str, ...] = (instance_count, 0, 0, 0, instance_count, 0)
    else:
        ledger_args = (
            ledger.instance_count,
            ledger.now_us,
            ledger.request_tat_us,
            ledger.token_tat_us,
            ledger.born_count,
            f"{ledger.offset_us:.3f}",
        )
    args: tuple[str | int, ...] = (
        now_arg,
        snap.request_ahead_us,
        snap.token_ahead_us,
        lease_ttl_us,
        *ledger_args,
        *snap.request_ids,
    )
    return keys, args


def _never_sent(exc: BaseException) -> bool:
    """redis-py failed while opening the connection, before any command went out."""
    return isinstance(exc, RedisConnectionError | RedisTimeoutError) and "connecting" in str(exc).lower()


class RedisLimiter:
    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        timeout_ms: int,
        instance_count: int = 1,
        batch_tokens: int = DEFAULT_BATCH_TOKENS,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        pool_wait_s: float = DEFAULT_POOL_WAIT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        own_connections: bool = True,
        now_override_us: Callable[[], int] | None = None,
    ) -> None:
        """`timeout_ms` bounds Redis's answer to one call (the client's socket timeout should be
        the same: from_url sets it); `own_connections=False` sends every call through redis-py
        (bench/limiter_paths.py measures both); `now_override_us` is for tests only: the scripts
        then take this time instead of Redis TIME, so a test can drive Redis and the twin
        together."""
        self._client = client
        self._timeout_s = timeout_ms / 1000
        # Connect, then at worst EVALSHA, SCRIPT LOAD and EVALSHA again (NOSCRIPT after a restart).
        self._call_bound_s = connect_timeout_s + 3 * self._timeout_s
        self._pool_wait_s = pool_wait_s
        self.batch_tokens = batch_tokens
        self._lease_ttl_s = lease_ttl_s
        self._lease_ttl_us = round(lease_ttl_s * policy.MICROS)
        self._now_override_us = now_override_us
        self._departed = ""  # free_slots_of's prefixes, as admit.lua takes them
        self._in_flight = asyncio.Semaphore(max_connections)
        self._admit = client.register_script(script_text("admit"))
        self._charge = client.register_script(script_text("charge"))
        self._settle = client.register_script(script_text("settle"))
        self._restore = client.register_script(script_text("restore"))
        self._read = client.register_script(script_text("read"))
        # After a store failure, Redis may lack what this instance counted (its fallback's
        # decisions; everything, if Redis restarted empty): put back (restore.lua) before the next
        # admission there. `_synced_at` is the failure count the last restore covered.
        self._synced_at = 0
        # Counts the fallback's "allowed" answers (its admits and the tokens its charges granted):
        # an admit on Redis that one overlapped must be checked against the mirror, which knows of
        # it while Redis does not (yet).
        self._fallback_allowed = 0
        # The count the last restore covered. A fallback "allowed" after a restore's snapshot (a
        # caller whose call failed while the restore was on its way) is missing on Redis even
        # though the restore landed: without another restore Redis admitted one too many beside
        # it (the over-admission by one that the kill drills found about one run in four).
        self._synced_fallback = 0
        # Counts the times the fleet counted this instance out and it came back (`restore_slots`),
        # and the count the last restore covered.
        self._counted_out = 0
        self._synced_counted_out = 0
        # The limiter's own connections lost (direct_calls.py) that the last restore covered: a
        # Redis restarted empty between two calls failed no call, so only its lost connection says
        # this instance's counts may be missing there. A lost connection to a Redis that kept its
        # data costs a restore that changes nothing (restore.lua keeps the later of each count).
        self._synced_lost = 0
        self._restoring: asyncio.Task[None] | None = None
        self._resync_lock = asyncio.Lock()
        self._closing = False
        # Names this instance's ledgers on Redis (restore.lua).
        self._instance = uuid.uuid4().hex[:16]
        self._instance_count = instance_count
        self._health = StoreHealth(backoff_s)
        self._settles = SettleQueue(self._send_settles, self._health)
        # This instance's own traffic, mirrored: the fail-open fallback's state.
        self._local = MemoryLimiter(
            batch_tokens=batch_tokens, lease_ttl_s=lease_ttl_s, instance_count=instance_count
        )
        self._rates: dict[TierLimits, policy.Rates] = {}
        # This instance's running streams: when one ends is a concurrency denial's real wait.
        self._ends = StreamEnds(
            time.monotonic if now_override_us is None else lambda: now_override_us() / policy.MICROS
        )
        self._cluster_ready = not isinstance(client, RedisCluster)
        # Connections of the limiter's own whose replies wake their callers directly
        # (limiter/direct_calls.py), to one server or a Cluster's nodes, plain or TLS, for every
        # call; redis-py's client serves the rest (a Unix socket, a credential provider).
        self._direct = (
            DirectCalls.for_client(client, connect_timeout_s, self._call_bound_s) if own_connections else None
        )
        self._batchers: list[CallBatcher] = []  # redis-py's path only
        self._admit_call = self._way("admit", self._admit, max_in_flight=1)
        self._charge_call = self._way("charge", self._charge)
        self._settle_call = self._way("settle", self._settle)
        self._read_call = self._way("read", self._read)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout_ms: int,
        instance_count: int = 1,
        cluster: bool = False,
        connect_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> RedisLimiter:
        """`redis://…` for one server, `redis+cluster://…` (or cluster=True) for a Cluster.
        `connect_timeout_s` defaults to the longer of DEFAULT_CONNECT_TIMEOUT_S and the answer
        bound: opening a connection on a loaded host is slow, not a failed store."""
        if connect_timeout_s is None:
            connect_timeout_s = max(DEFAULT_CONNECT_TIMEOUT_S, timeout_ms / 1000)
        options: dict[str, Any] = {
            "socket_timeout": timeout_ms / 1000,
            "socket_connect_timeout": connect_timeout_s,
            # No silent re-sends: a script re-sent after a timeout may run twice. The limiter
            # decides itself what a failed call means.
            "retry": Retry(NoBackoff(), 0),
        }
        return cls(
            redis_url.connect(url, cluster=cluster, **options),
            timeout_ms=timeout_ms,
            instance_count=instance_count,
            connect_timeout_s=connect_timeout_s,
            **kwargs,
        )

    async def connect(self) -> None:
        """Open the limiter's own connections now (to every primary of a Cluster) instead of on
        the first calls, so a new edge's first requests pay no handshakes. A failure is logged, not
        raised: the first calls try again, and the tiers' store-failure policy answers meanwhile.
        Then says so where Redis may evict the limiter's keys (`_check_eviction`)."""
        if self._direct is not None:
            try:
                async with asyncio.timeout(self._call_bound_s):
                    await self._direct.open_all()
            except Exception as exc:  # any driver failure: the calls will meet it again, and say so
                log.warning("limiter_connect_failed", error=type(exc).__name__, detail=str(exc))
                return  # not another call's bound on a Redis out of reach
        await self._check_eviction()

    async def _check_eviction(self) -> None:
        """A warning for each server (a Cluster's primaries) whose maxmemory policy evicts keys at
        its memory limit: every limiter key has a TTL, so a volatile-* policy evicts them as well as
        an allkeys-* one, and a user whose budget was evicted gets the whole window again, with
        nothing said (a day's budget spent twice over on a full allkeys-lru or volatile-lru Redis,
        ElastiCache's default). With noeviction a full Redis refuses the scripts instead, and each
        tier's on_store_failure answers. Best effort: a server or user refusing INFO says nothing."""
        client = self._client
        try:
            async with asyncio.timeout(self._call_bound_s):
                if isinstance(client, RedisCluster):
                    await client.initialize()
                    infos = [
                        (node.name, await client.info("memory", target_nodes=node))
                        for node in client.get_primaries()
                    ]
                else:
                    infos = [("", await client.info("memory"))]
        except Exception as exc:  # the calls that matter say so themselves
            log.info("limiter_eviction_check_skipped", error=type(exc).__name__, detail=str(exc))
            return
        for node, info in infos:
            policy_name = str(info.get("maxmemory_policy", "noeviction"))
            if int(info.get("maxmemory", 0)) > 0 and policy_name != "noeviction":
                log.warning(
                    "limiter_store_evicts",
                    node=node or None,
                    maxmemory_policy=policy_name,
                    maxmemory=int(info["maxmemory"]),
                    detail="at its memory limit this Redis evicts the limiter's keys, giving users "
                    "their limits afresh: set maxmemory-policy noeviction",
                )

    def set_instance_count(self, n: int) -> None:
        """The fail-open fallback enforces 1/n of every limit from now on (the live edge count)."""
        self._local.set_instance_count(n)
        self._instance_count = n

    def free_slots_of(self, holders: Collection[str]) -> None:
        """From now on an admit that finds its user's slots full frees those of `holders` first:
        the request-id prefixes of edge instances that died holding them (admit.lua)."""
        self._departed = " ".join(holders)

    def restore_slots(self) -> None:
        """This instance is back in the fleet after the others counted it out (a stall past its
        membership TTL, edge/membership/): their admits may have freed its running requests' slots
        as a dead instance's (admit.lua), which leaves its users over their concurrency limit and
        its settles refunding nothing (settle.lua refunds with the slot it removes). Puts them back
        now (restore.lua, as after an outage: a settled request gets none), and before the next
        admit should this fail. Also for a Redis that lost the fleet's keys and so the limiter's
        (restarted empty, FLUSHALL: edge/membership/), which this instance's own calls need not
        notice: everything it counted goes back, running requests' slots included. Call on the
        loop."""
        self._counted_out += 1
        self._resync_soon()

    def _resync_soon(self) -> None:
        """Put back in the background what Redis is missing of this instance's count. Waiting for
        this instance's next admit instead left a request the fallback admitted during an outage
        without its slot on Redis until then, and a cancel that reached another instance (or
        worker) answered 404 for a stream that went on streaming and charging (a review, with
        Redis paused 10 s under `--workers 2`: three cancels refused in 11.7 s)."""
        if self._closing:
            return
        if self._restoring is None or self._restoring.done():
            # A context of its own, not the request's whose admit started it (its log lines).
            self._restoring = asyncio.get_running_loop().create_task(
                self._restore_now(), name="limiter-restore", context=contextvars.Context()
            )

    async def _restore_now(self) -> None:
        try:
            await self._resync()
        except (_NotSent, _NoAnswer):
            pass  # counted as the store's failure: the next admit restores first

    @property
    def fallback_active(self) -> bool:
        return self._health.failing

    @property
    def pending_settles(self) -> int:
        """Settles not yet landed on Redis (retried in the background)."""
        return len(self._settles)

    def _rates_for(self, tier: TierLimits) -> policy.Rates:
        rates = self._rates.get(tier)
        if rates is None:
            rates = self._rates[tier] = policy.rates_for(tier)
        return rates

    def _now_arg(self) -> str:
        return "" if self._now_override_us is None else str(self._now_override_us())

    def _way(self, op: Op, script: AsyncScript, **batching: int) -> _ScriptCall:
        """How `script` is called, chosen once. On the limiter's own connections each call is its
        own command, written at once, its reply waking its caller where it is read
        (limiter/resp_connection.py; the commands of one pass of the loop still share a write). A
        batcher there cost each call a writer task, a gather and a batch's bookkeeping for what the
        connection's write already shares: without it a one-token stream's set-up on Redis took
        0.97x the CPU (docs/bench-streams.md, twentieth pass).

        Where the calls cannot take those connections (a Unix socket, a credential provider),
        concurrent callers' calls wait in a batcher (call_batcher.py, `batching` its options) and
        share round trips through redis-py. Batched admits keep one batch on the wire: with client
        and Redis on shared cores, fewer, larger batches cost less CPU per decision
        (bench/limiter.py: 86-90 % of a trivial EVALSHA's CPU, against 72-87 % with four in
        flight). A tuning choice only: the over-admission that several in flight showed around a
        Redis restart was a fallback "allowed" after a restore's snapshot, fixed
        (`_synced_fallback`)."""
        if (direct := self._direct) is not None:

            async def one(keys: Sequence[str], args: Sequence[str | int], epoch: int | None = None) -> Any:
                # Bounded by direct_calls.py itself: the reply's deadline is its connection's.
                call = partial(direct.call, script, keys, args)
                return await self._call(op, call, epoch=epoch, bounded=False)

            return one

        def send(calls: list[tuple[Sequence[str], Sequence[str | int]]], epoch: int) -> Awaitable[list[Any]]:
            # Only an admit's batch carries the restore epoch it was decided under.
            epoch_kept = epoch if op == "admit" else None
            return self._call(op, lambda: self._send_all(script, calls), epoch=epoch_kept)

        batcher = CallBatcher(send, **batching)
        self._batchers.append(batcher)

        async def batched(keys: Sequence[str], args: Sequence[str | int], epoch: int | None = None) -> Any:
            return await batcher.call(keys, args, 0 if epoch is None else epoch)

        return batched

    async def _call(
        self, op: Op, send: Callable[[], Awaitable[Any]], *, epoch: int | None = None, bounded: bool = True
    ) -> Any:
        """One bounded round trip (`bounded` False: `send` bounds itself). Raises _NotSent when it
        never reached Redis, _NoAnswer when Redis did not answer (the store is then marked down) or
        when a batch's call met a slot mid-migration while its others may have run (not marked).
        While the store is down, only the probe (store_health.py) gets past the first check."""
        health = self._health
        probe = health.failing
        if not health.may_call():
            raise _NotSent
        in_flight = self._in_flight
        try:
            if not in_flight.locked():
                await in_flight.acquire()  # a free slot: taken at once, no deadline to arm
            else:
                try:
                    async with asyncio.timeout(self._pool_wait_s):
                        await in_flight.acquire()
                except TimeoutError:
                    STORE_BUSY.labels(op=op).inc()
                    raise _NotSent from None
            try:
                if health.failing and not probe:  # it failed while this call waited
                    raise _NotSent
                if epoch is not None and epoch != health.failures:
                    raise _NotSent
                if not self._cluster_ready:
                    # Fetch the slot map before the first burst of calls: redis-py's cluster client
                    # fails with AttributeError when many first calls race to set it up. One-time
                    # set-up, bounded by the client's own connect and read timeouts.
                    await self._client.initialize()
                    self._cluster_ready = True
                if bounded:
                    async with asyncio.timeout(self._call_bound_s):
                        result = await send()
                else:
                    result = await send()
            except _NotSent:
                raise
            except SlotBusy as exc:
                # One slot mid-migration (limiter/direct_calls.py), not the store: this call alone
                # is answered without Redis, as one that found no free connection is; every other
                # user's calls keep going to Redis. Taken for a store failure, a resharding put the
                # whole edge on the fallback for a backoff.
                SLOT_BUSY.labels(op=op).inc()
                log.warning("limiter_slot_busy", op=op, detail=str(exc))
                raise (_NotSent if exc.ran_none else _NoAnswer) from exc
            # Any failure of the store or its driver (redis-py's cluster client has raised
            # AttributeError in races) is a store failure: the tier's policy answers, nothing escapes.
            except Exception as exc:
                health.failed(op, exc)
                raise (_NotSent if _never_sent(exc) else _NoAnswer) from exc
            finally:
                in_flight.release()
        finally:
            if probe:
                health.probe_ended()  # a no-op after failed or succeeded; else cancelled or not sent
        health.succeeded(op)
        if op != "restore" and not self._in_sync():
            self._resync_soon()  # back after an outage, or on a new connection: maybe a new Redis
        return result

    async def admit(
        self,
        user: str,
        request_id: str,
        tier: TierLimits,
        input_tokens: int,
        max_output_tokens: int,
        *,
        asked_output_tokens: int | None = None,
    ) -> Admission:
        rates = self._rates_for(tier)
        lease_tokens = policy.initial_lease(rates, self.batch_tokens, input_tokens, max_output_tokens)
        keys = admit_keys(user, tier.name, request_id)
        args = (
            self._now_arg(),
            request_id,
            rates.request_window_us,
            rates.request_capacity,
            rates.token_window_us,
            rates.token_capacity,
            rates.max_concurrent,
            input_tokens,
            lease_tokens,
            self._lease_ttl_us,
            self._departed,
            policy.reply_to_wait_for(rates, input_tokens, lease_tokens, asked_output_tokens),
            tier.name,
        )
        # Read before the restore: a fallback "allowed" from here on may be missing on Redis.
        fallback_allowed = self._fallback_allowed
        try:
            # Sent only if no failure came between the restore and this call (else Redis may be a
            # restarted, empty one that this instance's running requests are missing from).
            epoch = await self._restored_for(user, tier.name)
        except (_NotSent, _NoAnswer):
            return self._fallback_admit(
                user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens, undo=None
            )
        try:
            reply = await self._admit_call(keys, args, epoch)
        except _NotSent:
            return self._fallback_admit(
                user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens, undo=None
            )
        except _NoAnswer:
            undo = input_tokens + lease_tokens
            return self._fallback_admit(
                user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens, undo=undo
            )
        allowed, limit, retry_ms, rem_req, reset_req, rem_tok, reset_tok, req_wait, tok_wait = (
            int(v) for v in reply
        )
        if allowed and (self._health.failures != epoch or self._fallback_allowed != fallback_allowed):
            # A failure came while this call was in flight, or the fallback admitted meanwhile
            # what Redis does not know yet: only what the mirror allows too stands.
            local, _ = self._local.decide(
                user,
                request_id,
                tier,
                input_tokens,
                max_output_tokens,
                asked_output_tokens=asked_output_tokens,
            )
            if not local.allowed:
                self._undo(user, tier, request_id, input_tokens + lease_tokens)
                # Redis admitted it: its share's wait (hours on a daily budget) is no answer, only
                # the wait until Redis is tried again, as for the fallback's own refusals.
                local = self._provisional(
                    local, user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens
                )
                return self._admission(
                    local, user, tier, request_id, input_tokens, 0, max_output_tokens, local_limits=True
                )
            # Redis charged the whole prompt, and the lease refunds it whole, on Redis and the twin
            # alike; the mirror charged only its share of a prompt past the share (charged_input).
            # It counts the rest too, as record_admitted would have: else a refund took back more
            # than it charged, out of the user's other requests, and a fallback then let this
            # instance past its share by the difference.
            rest = input_tokens - self._local.charged_input(tier, input_tokens)
            self._local.record_charged(user, tier, request_id, rest)
        elif allowed:
            self._local.record_admitted(user, request_id, tier, input_tokens + lease_tokens)
        decision = Decision(
            allowed=bool(allowed),
            limit=_LIMIT_NAMES.get(limit),
            retry_after_ms=retry_ms,
            limit_requests=rates.request_capacity,
            remaining_requests=rem_req,
            reset_requests_ms=reset_req,
            limit_tokens=rates.token_capacity,
            remaining_tokens=rem_tok,
            reset_tokens_ms=reset_tok,
            request_wait_ms=req_wait,
            token_wait_ms=tok_wait,
        )
        return self._admission(
            decision, user, tier, request_id, input_tokens, lease_tokens, max_output_tokens
        )

    async def take_read(self, user: str, tier: TierLimits) -> ReadDecision:
        """One history read of the user's read budget (scripts/read.lua); while Redis does not
        answer, this instance's share of it (limiter/reads.py: never failing closed)."""
        window_us, capacity = read_rates(tier)
        try:
            reply = await self._read_call(
                (read_key(user, tier.name),), (self._now_arg(), window_us, capacity)
            )
        except (_NotSent, _NoAnswer):
            return self._local.take_read_now(user, tier)
        allowed, remaining, reset_ms, retry_ms = (int(v) for v in reply)
        return ReadDecision(bool(allowed), capacity, remaining, reset_ms, retry_ms)

    def _admission(
        self,
        decision: Decision,
        user: str,
        tier: TierLimits,
        request_id: str,
        input_tokens: int,
        granted: int,
        max_output_tokens: int,
        *,
        local_limits: bool = False,
    ) -> Admission:
        """`local_limits`: the fallback decided, on its share of the tier (per_instance), where all
        the user's slots it counts run on this instance: a concurrency denial waits for one of them
        to end. Reckoned with the tier's count, it took the rest as other edges' streams at unknown
        points of their lives, and told 1.7 s where the streams here had a minute to run."""
        # The lease talks to this store whichever side decided: its charges and settle reach
        # Redis whenever Redis answers, and the local mirror in every case.
        limits = per_instance(tier, self._instance_count) if local_limits else tier
        return admission(
            self,
            decision,
            user,
            tier,
            request_id,
            input_tokens=input_tokens,
            granted=granted,
            max_output_tokens=max_output_tokens,
            batch_tokens=self.batch_tokens,
            slot_ttl_s=self._lease_ttl_s,
            ends=self._ends,
            held_slots=limits.max_concurrent,
        )

    def _fallback_admit(
        self,
        user: str,
        request_id: str,
        tier: TierLimits,
        input_tokens: int,
        max_output_tokens: int,
        asked_output_tokens: int | None,
        *,
        undo: int | None,
    ) -> Admission:
        """The answer while Redis does not give one. `undo`: the tokens an admit that may have
        run on Redis charged there; unless this request now runs, it is settled there as never
        run (idempotent: a no-op when the script did not run or did not admit)."""
        if tier.on_store_failure == "closed":
            if undo is not None:
                self._undo(user, tier, request_id, undo)
            raise StoreUnavailable(self._health.turned_away_for(self._timeout_s))
        decision, lease_tokens = self._local.decide(
            user,
            request_id,
            tier,
            input_tokens,
            max_output_tokens,
            own=True,
            asked_output_tokens=asked_output_tokens,
        )
        if decision.allowed:
            self._fallback_allowed += 1
        else:
            if undo is not None:
                self._undo(user, tier, request_id, undo)
            decision = self._provisional(
                decision, user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens
            )
        # The lease says what the fallback charged: a prompt past this instance's share was charged
        # the share, on the twin and (once restored) on Redis, and is refunded that much, not more.
        charged = self._local.charged_input(tier, input_tokens)
        return self._admission(
            decision, user, tier, request_id, charged, lease_tokens, max_output_tokens, local_limits=True
        )

    def _provisional(
        self,
        decision: Decision,
        user: str,
        request_id: str,
        tier: TierLimits,
        input_tokens: int,
        max_output_tokens: int,
        asked_output_tokens: int | None,
    ) -> Decision:
        """A fallback refusal's waits (or those of a Redis admission the mirror overruled, in
        `admit`) as far as they are known: the share (1/n of the tier) refills n times slower than
        the tier, and Redis, which holds the tier's budget, answers again once the backoff is over.
        Each wait is at most until Redis is tried again, unless this instance's own count at the
        tier's whole rate already makes it longer (Redis holds that count too). Told the share's
        wait, a user was told 48 minutes, or hours on a daily token budget, by a Redis down for a
        second, which then admitted the same request at once."""
        floor = self._local.own_count_wait(
            user, request_id, tier, input_tokens, max_output_tokens, asked_output_tokens=asked_output_tokens
        )
        retry_ms = math.ceil(self._health.turned_away_for(self._timeout_s) * 1000)

        def bounded(wait_ms: int, floor_ms: int) -> int:
            return min(wait_ms, max(retry_ms, floor_ms))

        return replace(
            decision,
            retry_after_ms=max(1, bounded(decision.retry_after_ms, floor.retry_after_ms)),
            request_wait_ms=bounded(decision.request_wait_ms, floor.request_wait_ms),
            token_wait_ms=bounded(decision.token_wait_ms, floor.token_wait_ms),
        )

    def _undo(self, user: str, tier: TierLimits, request_id: str, tokens: int) -> None:
        self._settles.add(self._settle_op(user, tier, request_id, tokens, refund_request=True))

    async def charge(self, user: str, tier: TierLimits, request_id: str, want: int) -> int:
        rates = self._rates_for(tier)
        _, tokens_key, concurrency_key = user_keys(user, tier.name)
        args = (
            self._now_arg(),
            request_id,
            rates.token_window_us,
            rates.token_capacity,
            want,
            self._lease_ttl_us,
        )
        try:
            granted = int(await self._charge_call((tokens_key, concurrency_key), args))
        except (_NotSent, _NoAnswer):
            # (A charge that ran unanswered costs the user tokens: the safe side.)
            if tier.on_store_failure == "closed":
                # Nothing vouches for more: the stream stops, as the store's failure (a 503 to
                # retry), not as its budget's end (a 0 grant read "limit_reached: tokens", and a
                # client waited for a refill of a budget it still had).
                raise StoreUnavailable(self._health.turned_away_for(self._timeout_s)) from None
            # Fail-open: this instance's share of the budget pays for the rest of the stream.
            granted = self._local.charge_now(user, tier, request_id, want, own=True)
            if granted > 0:
                # Missing on Redis as a fallback admit is: counted so, a restore puts its ledger
                # back. A busy pool marks no failure, so nothing else said Redis lacked it, and
                # Redis admitted the user's next request on tokens this grant had spent.
                self._fallback_allowed += 1
            return granted
        self._local.record_charged(user, tier, request_id, granted)
        return granted

    def _in_sync(self) -> bool:
        """Redis holds what this instance counted: no failure, no fallback "allowed", no return to
        the fleet and no connection lost since the snapshot the last restore put back."""
        return self._synced_fallback == self._fallback_allowed and self._redis_kept_all(
            self._health.failures, self._counted_out, self._connections_lost()
        )

    def _redis_kept_all(self, failures: int, counted_out: int, lost: int) -> bool:
        """No failure, return to the fleet or lost connection since the last restore: Redis holds
        all that this instance counted but what its fallback counted alone (its ledgers), which it
        did only for want of a free connection (slow is not down) or after a restore's snapshot."""
        return (
            self._synced_at == failures
            and self._synced_counted_out == counted_out
            and self._synced_lost == lost
        )

    def _connections_lost(self) -> int:
        return 0 if self._direct is None else self._direct.lost

    async def _resync(self) -> None:
        """Put back on Redis what this instance counted while Redis failed (restore.lua), every
        user's budgets in round trips of RESTORE_CHUNK (an admit meanwhile puts back its own user's
        first: `_restored_for`), before admitting there again: the requests
        still running from the outage (or admitted by a Redis that since restarted empty) then
        hold their slots on Redis too, so Redis does not admit as many again beside them. Started
        while the store is down (`restore_slots`), a restore's first round trip may be the probe
        (store_health.py); within the store's backoff nothing is built (the call would be
        refused), and the call that finds Redis back starts it again (`_call`, `_restored_for`).

        Sent as one call, the restore had to fit in one call's bound (1.75 s by default), and the
        twin holds every user with a TAT ahead (a free user's one request stays 9 minutes ahead on
        its requests, 18 on its tokens): with 50,000 such users it timed out, the store was marked
        down, and every later try was the same restore, timed out again: the edge never used Redis
        again, and each admit built the whole snapshot first, blocking the loop for seconds. Each
        round trip is now its own bounded call, a failure anywhere ends this restore (sent again,
        whole, later: restore.lua is idempotent per ledger).

        Where Redis kept all but the ledgers (`_redis_kept_all`), only the budgets with a ledger
        go: a busy pool that sent one caller to the fallback restored every user the twin held, a
        whole restore's round trips on a pool already short of connections.

        The budgets to put back are looked for a slice of the twin's users at a time, the loop
        running between slices (MemoryLimiter.active_budgets): listed in one step, they held the
        loop 0.16 s at 200,000 users, every stream on the edge stalled meanwhile."""
        if self._health.failing and (self._resync_lock.locked() or self._health.retry_in() > 0):
            raise _NotSent
        async with self._resync_lock:
            if self._in_sync():
                return
            # Read before the snapshots: whatever comes after them needs another restore.
            failures, fallback_allowed = self._health.failures, self._fallback_allowed
            counted_out, lost = self._counted_out, self._connections_lost()
            kept = self._redis_kept_all(failures, counted_out, lost)
            restored = 0
            pending: list[tuple[str, str]] = []
            for found in self._local.active_budgets(ledgers_only=kept):
                pending += found
                while len(pending) >= RESTORE_CHUNK:
                    await self._send_restores(pending[:RESTORE_CHUNK], failures)
                    restored += RESTORE_CHUNK
                    del pending[:RESTORE_CHUNK]
                await asyncio.sleep(0)  # the loop runs between slices, round trip or not
            if pending:
                await self._send_restores(pending, failures)
                restored += len(pending)
            self._synced_at, self._synced_fallback = failures, fallback_allowed
            self._synced_counted_out, self._synced_lost = counted_out, lost
            log.info("limiter_restored", budgets=restored)

    async def _send_restores(self, budgets: Sequence[tuple[str, str]], failures: int) -> None:
        """restore.lua for each (user, tier) in one round trip, sent only while the failure count
        is still `failures`; the ledgers it carried marked sent."""
        calls: list[tuple[Sequence[str], Sequence[str | int]]] = []
        ledgers: list[tuple[str, str, LedgerSnapshot]] = []
        for user, tier in budgets:
            snap, ledger = self._local.snapshot(user, tier), self._local.ledger(user, tier)
            if ledger is not None:
                ledgers.append((user, tier, ledger))
            calls.append(
                restore_call(
                    user,
                    tier,
                    snap,
                    ledger,
                    instance=self._instance,
                    instance_count=self._instance_count,
                    lease_ttl_us=self._lease_ttl_us,
                    now_arg=self._now_arg(),
                )
            )
        sent = False

        def send() -> Awaitable[list[Any]]:
            nonlocal sent
            sent = True
            return self._send_all(self._restore, calls)

        try:
            await self._call("restore", send, epoch=failures)
        except _NotSent:
            for user, tier, ledger in ledgers:  # nothing ran: their settles refund in the ledger
                self._local.ledger_unsent(user, tier, ledger)
            raise
        except asyncio.CancelledError:
            # Called off (an admit whose client left) before it went out, as while it waited for a
            # free connection: nothing ran, as above. Taken as maybe run, its requests' settles
            # refunded nowhere (Redis never held them) and the next restore counted them for good.
            for user, tier, ledger in ledgers:
                if sent:
                    self._local.ledger_sent(user, tier, ledger, landed=False)
                else:
                    self._local.ledger_unsent(user, tier, ledger)
            raise
        except _NoAnswer:
            for user, tier, ledger in ledgers:  # it may have run: its settles go to Redis
                self._local.ledger_sent(user, tier, ledger, landed=False)
            raise
        for user, tier, ledger in ledgers:
            self._local.ledger_sent(user, tier, ledger, landed=True)

    async def _restored_for(self, user: str, tier: str) -> int:
        """Make Redis hold what this instance counted of `user` in `tier` (and the user's slots)
        before an admit there; the failure count that holds under (the admit is sent only if it
        still is). Raises _NotSent / _NoAnswer when it cannot: the fallback answers.

        The whole restore runs in the background and this admit puts back its own user's budget
        first, in one round trip of its own (restore.lua is idempotent per ledger and keeps the
        later of each count, so the whole restore sending it again changes nothing): each admit
        waited for every user's budgets to be restored, 1.27 s at 30,000 users. The same while the
        store fails: that round trip is then the probe (store_health.py), or, for a user the twin
        holds nothing of (nothing to put back), the admit itself is; either answered, the whole
        restore follows in the background. The probe admit ran the whole restore itself, and its
        user waited for all of it. Within the backoff nothing is built (the call would be
        refused)."""
        if self._in_sync():
            return self._synced_at
        health = self._health
        if health.failing and health.retry_in() > 0:
            raise _NotSent
        failures = health.failures
        kept = self._redis_kept_all(failures, self._counted_out, self._connections_lost())
        if self._local.holds(user, tier, ledgers_only=kept):
            await self._send_restores([(user, tier)], failures)
            self._resync_soon()  # (else the admit's own answer starts it: `_call`)
        return failures

    def _settle_op(
        self,
        user: str,
        tier: TierLimits,
        request_id: str,
        refund: int,
        *,
        refund_request: bool,
        cancelled: bool = False,
    ) -> PendingSettle:
        rates = self._rates_for(tier)
        args = (
            self._now_arg(),
            request_id,
            rates.token_window_us,
            refund,
            rates.request_window_us,
            int(refund_request),
            self._lease_ttl_us,
            rates.token_capacity,
            rates.request_capacity,
            int(cancelled),
        )
        keys = (*user_keys(user, tier.name), record_key(user, request_id))
        # Retried until the slot would have expired on Redis by itself (its last refresh was at
        # most now); past that there is nothing left to free.
        return PendingSettle(keys, args, expires_at=time.monotonic() + self._lease_ttl_s)

    async def settle(
        self,
        user: str,
        tier: TierLimits,
        request_id: str,
        refund: int,
        *,
        refund_request: bool = False,
        cancelled: bool = False,
    ) -> bool | None:
        self._ends.ended(user, request_id, ran=not refund_request)
        self._local.settle_now(user, tier, request_id, refund, refund_request=refund_request)
        op = self._settle_op(
            user, tier, request_id, refund, refund_request=refund_request, cancelled=cancelled
        )
        if self._health.retry_in() > 0:
            self._settles.add(op)
            return None
        # The first attempt is sent at once (with other callers' commands of this pass of the
        # loop); only a failed one goes to the retry queue (and its answer is not waited for).
        try:
            _, cancelled = await self._settle_call(op.keys, op.args)
        except (_NotSent, _NoAnswer):
            self._settles.add(op)
            return None
        return bool(cancelled)

    async def _send_settles(self, batch: list[PendingSettle]) -> bool:
        try:
            await self._call(
                "settle", lambda: self._send_all(self._settle, [(s.keys, s.args) for s in batch])
            )
        except (_NotSent, _NoAnswer):
            return False
        return True

    async def _send_all(
        self, script: AsyncScript, calls: Sequence[tuple[Sequence[str], Sequence[str | int]]]
    ) -> list[Any]:
        """Many calls of a script in one pipelined round trip, each still one atomic script run;
        their replies in order. The calls that met NOSCRIPT (and only those: they never ran) are sent
        again once the script is loaded (limiter/pipelined_replies.py). On the limiter's own
        connections where it has them, else through redis-py."""
        if self._direct is not None:
            return await self._direct.call_all(script, calls)
        if isinstance(self._client, RedisCluster):
            # redis-py's cluster pipeline refuses EVALSHA: one call each, concurrently, a few at a
            # time (each node's pool has a connection limit, and it raises rather than waits).
            # A slot that kept answering TRYAGAIN is SlotBusy here too (through_redis_py), not a
            # store failure; the batch's other calls may have run.
            replies: list[Any] = []
            try:
                for start in range(0, len(calls), _CLUSTER_CONCURRENCY):
                    chunk = calls[start : start + _CLUSTER_CONCURRENCY]
                    replies += await asyncio.gather(
                        *(through_redis_py(script, keys, args) for keys, args in chunk)
                    )
            except SlotBusy as exc:
                if len(calls) == 1:
                    raise
                raise SlotBusy(str(exc), ran_none=False) from exc
            return replies
        return await replies_loading_once(
            lambda batch: self._pipelined(pack_evalshas(script.sha, batch), len(batch)),
            lambda: self._client.script_load(script.script),
            script.sha,
            calls,
        )

    async def _pipelined(self, packed: bytes, replies: int) -> list[Any]:
        """Write `packed` on one pooled connection and read its `replies` (error replies as
        exception values). Any other failure closes the connection: its stream is out of step; so
        does a READONLY reply: its server is a replica now."""
        assert isinstance(self._client, Redis)
        pool = self._client.connection_pool
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(packed, check_health=False)
            results: list[Any] = []
            for _ in range(replies):
                try:
                    results.append(await conn.read_response())
                except ResponseError as exc:
                    results.append(exc)
            if any(isinstance(result, ReadOnlyError) for result in results):
                # Its server was demoted (limiter/direct_calls.py _leave_if_demoted): the pool
                # opens a new one, to whatever the endpoint's name leads to now.
                await conn.disconnect()
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        return results

    async def aclose(self) -> None:
        # The settles flushed below go through _call, which would start another restore.
        self._closing = True
        restoring, self._restoring = self._restoring, None
        if restoring is not None:
            restoring.cancel()
            await asyncio.wait({restoring})
        if self._direct is not None:
            self._direct.close()
        for batcher in self._batchers:
            await batcher.aclose()
        await self._settles.aclose()
        await self._client.aclose()
