"""Bearer key → Principal, through a short cache in front of the shared key store.

The bound: an edge answers from a lookup at most `ttl_s` old, so a revocation, a tier change or a new
key made anywhere reaches every edge within `ttl_s` (keys.cache_ttl_s). Where the limiter uses Redis
the change is also announced over pub/sub (edge/keys/changes.py) and dropped from every cache at
once; the TTL stays the bound when a message is lost. Unknown keys are cached too, for the same
time, so a flood of bad keys costs the store one read per key and TTL; in a cache of their own, so
that flood evicts only other unknown keys: in one shared cache, 100,000 random keys pushed every
real key out, and each real user's next request was a store read again (DynamoDB: a billed read).

One read per key at a time: requests that find a key's read under way wait for it rather than start
their own. An edge that starts (or a key's TTL that ends) under a burst of one user's requests
otherwise sends the store a read per request until the first comes back, each on a worker thread of
its own (DynamoDB: a billed read each): 16 requests at once, 16 reads before, 1 now.

A request waits at most LOOKUP_WAIT_S for its key's read, then is answered 503 (retry): the read goes
on, and its answer is cached for the retry. A store gone silent (a black-holed DynamoDB endpoint)
held each request through the client's every retry, about 20 s, and past the worker threads the
store calls share, the requests of more users than threads queued behind one another for as long as
the outage lasted."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable

import structlog

from edge.errors import ApiError, retry_after_headers
from edge.keys.metrics import KEY_LOOKUPS, KEY_REFUSALS
from edge.keys.principal import Principal
from edge.keys.record import KeyRecord, hash_key
from edge.keys.store import KeyStore

log = structlog.get_logger("floodgate.keys")

MAX_CACHED = 100_000  # keys the store knows (each an active user, or a key revoked or expired)
MAX_UNKNOWN = 100_000  # keys it does not know: what a flood of made-up keys fills
# The longest a request waits for its key's store read: a healthy store answers in milliseconds
# (SQLite's write lock, held by a CLI's write, included), and a retry a second later finds the
# answer of a slow read cached.
LOOKUP_WAIT_S = 3.0
# Resolved once: a labelled child per request would cost about as much as the cache hit itself.
_FROM_CACHE, _FROM_STORE = KEY_LOOKUPS.labels("cache"), KEY_LOOKUPS.labels("store")
_SHARED = KEY_LOOKUPS.labels("shared")


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key")


def refusal(status: str) -> ApiError:
    """Why a key that is not active is turned away: at admission, and in a stream it admitted that
    is ended when the key stops being active (edge/keys/stream_watch.py)."""
    if status == "unknown":
        return unauthorized("Incorrect API key provided.")
    return unauthorized(
        "This API key has expired." if status == "expired" else f"This API key has been {status}."
    )


def bearer_key(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer <key>` header; 401 when there is none."""
    if not authorization:
        raise unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise unauthorized("Malformed Authorization header; expected 'Bearer <key>'.")
    return key.strip()


class Authenticator:
    def __init__(
        self,
        store: KeyStore,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._clock = clock
        self._wall_clock = wall_clock
        # Lookups by key hash: (record, read at); the store's answer None in `_unknown`.
        self._cache: OrderedDict[str, tuple[KeyRecord | None, float]] = OrderedDict()
        self._unknown: OrderedDict[str, tuple[KeyRecord | None, float]] = OrderedDict()
        # The store reads under way, by key hash: the requests that need one wait for it.
        self._reads: dict[str, asyncio.Task[KeyRecord | None]] = {}

    async def authenticate(self, authorization: str | None) -> Principal:
        digest = hash_key(bearer_key(authorization))
        record = await self._lookup(digest)
        # The lookup is by hash, which an attacker cannot steer byte by byte; the final comparison is
        # constant-time all the same.
        if record is None or not hmac.compare_digest(record.key_sha256, digest):
            KEY_REFUSALS.labels("unknown").inc()
            raise refusal("unknown")
        status = record.status(self._wall_clock())
        if status != "active":
            KEY_REFUSALS.labels(status).inc()
            raise refusal(status)
        return Principal(
            user=record.user, tier=record.tier, key_id=record.id, key_sha256=digest, expires=record.expires
        )

    async def status(self, key_sha256: str) -> tuple[str, float | None]:
        """A key's status now and its expiry, read as `authenticate` reads it (the cache, else the
        store once for every caller): what a running stream's key is re-checked with. Raises ApiError
        (503) when the store cannot be read."""
        record = await self._lookup(key_sha256)
        if record is None:
            return "unknown", None
        return record.status(self._wall_clock()), record.expires

    def stale_in(self, key_sha256: str) -> float:
        """Seconds until the cached lookup of a key is older than the TTL (0: none is cached): the
        next look at it after that reads the store."""
        cached = self._cached(key_sha256)
        if cached is None:
            return 0.0
        return max(0.0, cached[1] + self.ttl_s - self._clock())

    def cached_status(self, key_sha256: str) -> tuple[str, float | None] | None:
        """What `status` would answer from the cache, without a read (None: nothing fresh cached)."""
        cached = self._cached(key_sha256)
        if cached is None or self._clock() - cached[1] >= self.ttl_s:
            return None
        record = cached[0]
        if record is None:
            return "unknown", None
        return record.status(self._wall_clock()), record.expires

    def invalidate(self, key_sha256: str | None = None) -> None:
        """Forget one key's lookup (None: all of them): the next request reads the store."""
        if key_sha256 is None:
            self._cache.clear()
            self._unknown.clear()
            self._reads.clear()
        else:
            self._cache.pop(key_sha256, None)
            self._unknown.pop(key_sha256, None)
            # A read under way may have read the record before the change: later requests read
            # again, and its answer (given to the requests that waited for it) is not kept.
            self._reads.pop(key_sha256, None)

    def _cached(self, digest: str) -> tuple[KeyRecord | None, float] | None:
        cached = self._cache.get(digest)
        return self._unknown.get(digest) if cached is None else cached

    async def _lookup(self, digest: str) -> KeyRecord | None:
        now = self._clock()
        cached = self._cached(digest)
        if cached is not None and now - cached[1] < self.ttl_s:
            _FROM_CACHE.inc()
            return cached[0]
        read = self._reads.get(digest)
        if read is None:
            _FROM_STORE.inc()
            read = self._reads[digest] = asyncio.ensure_future(self._read(digest, now))
            read.add_done_callback(_retrieved)
        else:
            _SHARED.inc()
        try:
            # Shielded: a request cancelled while it waits (its client gone), or past the wait,
            # leaves the read to the others and to the retry.
            return await asyncio.wait_for(asyncio.shield(read), LOOKUP_WAIT_S)
        except Exception as exc:
            error = f"no answer within {LOOKUP_WAIT_S:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            log.warning("key_store_unavailable", error=error)
            raise ApiError(
                503,
                "API keys cannot be checked right now; please retry.",
                code="key_store_unavailable",
                headers=retry_after_headers(1.0),
            ) from None

    async def _read(self, digest: str, started: float) -> KeyRecord | None:
        """The store's record, kept for the TTL from `started` unless the key was invalidated
        meanwhile (then this read is no longer the key's)."""
        try:
            record = await self.store.get(digest)
        finally:
            current = self._reads.get(digest) is asyncio.current_task()
            if current:
                del self._reads[digest]
        if current:
            kept, other, bound = (
                (self._unknown, self._cache, MAX_UNKNOWN)
                if record is None
                else (self._cache, self._unknown, MAX_CACHED)
            )
            other.pop(digest, None)  # a key made or deleted since its last lookup
            kept[digest] = (record, started)
            kept.move_to_end(digest)
            if len(kept) > bound:
                kept.popitem(last=False)
        return record


def _retrieved(read: asyncio.Task[KeyRecord | None]) -> None:
    """Its failure is read here too: every request that waited for it may have been cancelled."""
    if not read.cancelled():
        read.exception()
