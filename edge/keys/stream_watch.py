"""The streams a key admitted end when the key stops being active (revoked, expired, rotated past its
grace, gone from the store).

A key was checked only when a request was admitted: a key revoked mid-stream kept its streams
running to their end (up to 16 streams of 4,096 tokens each for a leaked paid key), while the cancel
endpoint refused the revoked key itself. Here every running generation is registered under its
key's hash, and each key with streams is looked at again:

* when the cache's lookup of it turns stale (`keys.cache_ttl_s`), through the Authenticator's cache
  (edge/keys/authenticator.py): at most the one store read per key and TTL a request would cause
  anyway, never one per stream or per token; so a change reaches a stream within the TTL, the bound
  it has for a new request;
* at its known expiry (a rotation's grace end included), so an expiring key ends on time;
* at once when a change to it is announced (pub/sub over Redis, or the admin API on this edge):
  the Authenticator's invalidate hook calls `changed`.

A key found not active cancels the scope of each of its generations, the scope a cancel and the
drain's deadline cut (edge/cancel/live.py, edge/drain.py): the generation ends its stream with an
error event saying why and `[DONE]` (a non-streaming request answers 401), frees the replica's
sequence and settles its limits as for a cancel (edge/generation.py).

Per stream: a set insert and discard and a look at the key's cached lookup (no store read) on the
stream's set-up, nothing per token. The timer is per key: a key whose streams all ended is forgotten
when its timer next fires, so back-to-back streams of one key set no timer each.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable

import anyio
import structlog

from edge.errors import ApiError
from edge.keys.authenticator import Authenticator
from edge.keys.record import key_id

log = structlog.get_logger("floodgate.keys")


class _Key:
    """One key with streams (or with streams until its timer fires)."""

    __slots__ = ("ended", "expires", "looks", "streams", "timer")

    def __init__(self, expires: float | None) -> None:
        self.expires = expires  # Unix seconds, as last read; None: never
        self.streams: set[anyio.CancelScope] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.ended: str | None = None  # the status it was found in, once not active
        self.looks = 0  # the looks at it begun so far: only the latest one's answer is kept


class StreamWatch:
    def __init__(self, authenticator: Authenticator, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._auth = authenticator
        self._wall_clock = wall_clock
        self._keys: dict[str, _Key] = {}
        self._checks: set[asyncio.Task[None]] = set()
        self._closed = False

    def watch(self, key_sha256: str, expires: float | None, scope: anyio.CancelScope) -> None:
        """Cancel `scope`, the one a generation runs in, when the key stops being active (at once
        if it already was found so); `unwatch` it when the generation ends."""
        key = self._keys.get(key_sha256)
        if key is not None and key.ended is not None:
            scope.cancel()
            key.streams.add(scope)
            return
        new = key is None
        if key is None:
            key = self._keys[key_sha256] = _Key(expires)
        key.streams.add(scope)
        # The cache may know better than the request's admission did (a change since, read by
        # another request): the stream was admitted before a revocation or rotation and queued
        # (a review). Also for a key with streams already, or whose last ended just now: a lost
        # announcement leaves its timer a TTL away. A read of the cache only, never of the store.
        known = self._auth.cached_status(key_sha256)
        if known is not None and known[0] != "active":
            self._check_soon(key_sha256)
        elif known is not None and known[1] != key.expires:
            key.expires = known[1]
            # Newer than any look under way, whose older answer would set the expiry back (a review).
            key.looks += 1
            self._schedule(key_sha256, key)
        elif new:
            self._schedule(key_sha256, key)

    def unwatch(self, key_sha256: str, scope: anyio.CancelScope) -> str | None:
        """The key's status when the watch ended the generation's scope, else None."""
        key = self._keys.get(key_sha256)
        if key is None:
            return None
        key.streams.discard(scope)
        if key.ended is not None and not key.streams:
            del self._keys[key_sha256]
        return key.ended

    def changed(self, key_sha256: str | None) -> None:
        """A change to a key was announced: look at it now if it has streams. None (every key, after
        a resubscription) changes nothing here: the Authenticator forgot every lookup, so each key's
        timer reads the store within the TTL, without a read of every key at once."""
        if key_sha256 is not None and key_sha256 in self._keys:
            self._check_soon(key_sha256)

    async def aclose(self) -> None:
        self._closed = True
        for key in self._keys.values():
            if key.timer is not None:
                key.timer.cancel()
        self._keys.clear()
        for check in list(self._checks):
            check.cancel()
        if self._checks:
            await asyncio.wait(self._checks)

    def _schedule(self, digest: str, key: _Key, retry: bool = False) -> None:
        """The next look: when the cached lookup turns stale, or at the expiry if sooner; a TTL
        from now after a failed read (none is cached then: it would be at once, again and again).

        An expiry already passed is a look at once (which finds it expired with no store read),
        never a look a TTL away. It passes here after a look that found the key active: uvloop
        rounds a timer to the millisecond and fires it by the loop's cached time, so the look at
        the expiry may run just before it, and the expiry can pass between that look's status and
        this. The stream set up after its key's expiry, with its request's lookup still cached, is
        another. Dropping it ran a rotated key's stream a TTL past its grace (to its max_tokens,
        now and then, in test_a_key_rotated_mid_stream_ends_it_when_its_grace_ends)."""
        if key.timer is not None:
            key.timer.cancel()
        delay = self._auth.ttl_s if retry else self._auth.stale_in(digest)
        if key.expires is not None:
            delay = min(delay, max(0.0, key.expires - self._wall_clock()))
        # An empty context: the timer is the key's, not the request's whose stream set it (its
        # request_id must not be bound to the check's log lines).
        key.timer = asyncio.get_running_loop().call_later(
            delay, self._due, digest, context=contextvars.Context()
        )

    def _due(self, digest: str) -> None:
        key = self._keys.get(digest)
        if key is None:
            return
        key.timer = None
        if not key.streams:
            del self._keys[digest]  # its streams all ended: nothing to look at
            return
        self._check_soon(digest)

    def _check_soon(self, digest: str) -> None:
        if self._closed:
            return
        # An empty context, as the timer's: a look ends every stream of the key, and one started
        # by a stream's set-up (`watch`) must not carry that request's request_id on its lines.
        check = asyncio.get_running_loop().create_task(self._check(digest), context=contextvars.Context())
        self._checks.add(check)
        check.add_done_callback(self._checks.discard)

    async def _check(self, digest: str) -> None:
        key = self._keys.get(digest)
        look = 0
        if key is not None:
            key.looks += 1
            look = key.looks
        expires: float | None = None
        if key is not None and key.expires is not None and key.expires <= self._wall_clock():
            # Its known expiry has passed: nothing extends one, so no store read is needed (and a
            # store that is down cannot keep the streams running past it).
            status: str | None = "expired"
        else:
            try:
                status, expires = await self._auth.status(digest)
            except ApiError:
                # The store is unreachable (the Authenticator logs it): nothing says the key changed,
                # so its streams go on; the next look is a TTL away (or at the expiry known).
                status = None
        key = self._keys.get(digest)
        if key is None or key.ended is not None or self._closed:
            return
        if look != key.looks:
            # A later look began while this one read (an announced change: a rotation, say); this
            # read may be from before the change, and coming back last it set the key's expiry
            # back to none and its next look a TTL away. The later look's answer stands.
            return
        if status is None or status == "active":
            if status is not None:
                key.expires = expires  # a rotation may have set one
            self._schedule(digest, key, retry=status is None)
            return
        key.ended = status
        if key.timer is not None:
            key.timer.cancel()
            key.timer = None
        log.info("key_streams_ended", key_id=key_id(digest), key_status=status, streams=len(key.streams))
        for scope in key.streams:
            scope.cancel()
        if not key.streams:
            del self._keys[digest]
