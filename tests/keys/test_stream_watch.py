"""The key watch's next look at a key (edge/keys/stream_watch.py), with the interleavings that ended
a rotated key's stream late forced by hand: a clock each read of which is later, a store whose
reads are held. The end-to-end tests (tests/keys/test_key_streams.py) run the same paths on a
live edge."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import structlog

from edge.keys.authenticator import Authenticator
from edge.keys.record import KeyRecord, new_record
from edge.keys.stream_watch import StreamWatch
from tests.limiter.clock import ManualClock

pytestmark = pytest.mark.anyio

# Far longer than any test: only a look the watch schedules at the expiry ends the stream.
TTL_S = 3600.0
# Enough turns of the loop for a look due at once to run and cancel the stream: a look takes a few.
LOOP_TURNS = 20


class TickingClock(ManualClock):
    """A wall clock time passes on between reads: each read is `step` later than the one before."""

    def __init__(self, start: float = 1_000.0, step: float = 1.0) -> None:
        super().__init__(start)
        self.step = step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now


class HeldStore:
    """A key store whose reads return the record as it was when each began, once the test lets it."""

    def __init__(self, record: KeyRecord) -> None:
        self.records = {record.key_sha256: record}
        self.held: list[asyncio.Event] = []

    async def get(self, key_sha256: str) -> KeyRecord | None:
        record = self.records.get(key_sha256)
        gate = asyncio.Event()
        self.held.append(gate)
        await gate.wait()
        return record


class DictStore:
    def __init__(self, record: KeyRecord) -> None:
        self.records = {record.key_sha256: record}

    async def get(self, key_sha256: str) -> KeyRecord | None:
        return self.records.get(key_sha256)


async def _turns(until: Callable[[], bool]) -> None:
    """Turns of the loop until `until()` holds, LOOP_TURNS at most (counted, not timed)."""
    for _ in range(LOOP_TURNS):
        if until():
            return
        await asyncio.sleep(0)


def _timer_delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays of the watch's timers from now on, in the order they are set (the last one is
    the next look)."""
    loop = asyncio.get_running_loop()
    delays: list[float] = []
    call_later = loop.call_later

    def spy(delay: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__name__", "") == "_due":
            delays.append(delay)
        return call_later(delay, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_later", spy)
    return delays


def _expiring(start: float, in_s: float) -> KeyRecord:
    _, record = new_record("di", "paid")
    return record.with_changes(expires=start + in_s, replaced_by="key_successor")


async def test_a_look_just_before_the_expiry_that_schedules_just_after_it_ends_the_stream() -> None:
    """The flake of test_a_key_rotated_mid_stream_ends_it_when_its_grace_ends (now and then): uvloop
    rounds a timer to the millisecond and fires it by a cached loop time, so the look at a rotated
    key's grace end ran up to a millisecond before it. The key was still active then; by the time
    the next look was scheduled the expiry had passed, and a passed expiry was dropped from the
    delay: the next look came a cache TTL (an hour) later and the stream ran to max_tokens."""
    clock = TickingClock()
    record = _expiring(clock.now, 10.0)
    digest = record.key_sha256
    auth = Authenticator(DictStore(record), TTL_S, clock=ManualClock(), wall_clock=clock)
    watch = StreamWatch(auth, wall_clock=clock)
    await auth.status(digest)  # the lookup its request made, cached for the TTL
    scope = anyio.CancelScope()
    watch.watch(digest, record.expires, scope)
    # The look: the watch's clock reads 1.5 s before the expiry, the Authenticator's (the status)
    # 0.5 s before, the schedule's 0.5 s after.
    assert record.expires is not None
    clock.now = record.expires - 1.5
    watch.changed(digest)
    await _turns(lambda: scope.cancel_called)
    assert scope.cancel_called
    assert watch.unwatch(digest, scope) == "expired"
    await watch.aclose()


async def test_a_stream_set_up_after_its_keys_expiry_ends_at_once_though_its_lookup_is_cached() -> None:
    """Admitted a moment before its key's expiry, set up after it: its lookup is cached for the TTL,
    and a passed expiry no longer defers the first look to the TTL's end."""
    clock = ManualClock()
    record = _expiring(clock.now, 1.0)
    digest = record.key_sha256
    auth = Authenticator(DictStore(record), TTL_S, clock=ManualClock(), wall_clock=clock)
    watch = StreamWatch(auth, wall_clock=clock)
    assert (await auth.status(digest))[0] == "active"
    clock.advance(1.0)
    scope = anyio.CancelScope()
    watch.watch(digest, record.expires, scope)
    await _turns(lambda: scope.cancel_called)
    assert scope.cancel_called
    assert watch.unwatch(digest, scope) == "expired"
    await watch.aclose()


async def _rotated_during_a_look() -> tuple[
    ManualClock, str, HeldStore, Authenticator, StreamWatch, anyio.CancelScope
]:
    """A stream of a key watched with nothing cached: its look's store read is held, and meanwhile
    the key is rotated in the store (its grace ends in 0.5 s), not yet announced."""
    clock = ManualClock()
    _, record = new_record("di", "paid")
    digest = record.key_sha256
    store = HeldStore(record)
    auth = Authenticator(store, TTL_S, clock=ManualClock(), wall_clock=clock)
    watch = StreamWatch(auth, wall_clock=clock)
    scope = anyio.CancelScope()
    watch.watch(digest, None, scope)  # nothing cached: a look at once, its read held
    await _turns(lambda: len(store.held) == 1)
    store.records[digest] = record.with_changes(expires=clock.now + 0.5, replaced_by="key_successor")
    return clock, digest, store, auth, watch, scope


async def test_a_look_that_read_the_key_before_a_rotation_does_not_undo_the_look_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look under way when a rotation is announced read the record before it; the look the
    announcement started reads the grace's end. The first one's answer, back last, set the key's
    expiry back to none and the next look a TTL away: the stream outlived the grace by up to a TTL."""
    due_in = _timer_delays(monkeypatch)
    _, digest, store, auth, watch, scope = await _rotated_during_a_look()
    # Announced (edge/keys/services.py's `changed`).
    auth.invalidate(digest)
    watch.changed(digest)
    await _turns(lambda: len(store.held) == 2)
    store.held[1].set()  # the look after the rotation answers first
    await _turns(lambda: len(due_in) == 2)
    assert due_in[-1] <= 0.5
    store.held[0].set()  # then the one from before it
    await _turns(lambda: False)
    assert due_in[-1] <= 0.5, due_in
    assert not scope.cancel_called
    await watch.aclose()


def _watched_key() -> tuple[ManualClock, KeyRecord, DictStore, Authenticator, StreamWatch]:
    """A key in a store, its authenticator and a stream watch, on a wall clock the test moves."""
    wall = ManualClock()
    _, record = new_record("di", "paid")
    store = DictStore(record)
    auth = Authenticator(store, TTL_S, clock=ManualClock(), wall_clock=wall)
    return wall, record, store, auth, StreamWatch(auth, wall_clock=wall)


async def _cut_at_once(watch: StreamWatch, digest: str, admitted_expiry: float | None) -> bool:
    """A stream of the key set up now, its admission having seen `admitted_expiry`: whether the
    watch cut it within a few turns of the loop. The watch is closed after."""
    scope = anyio.CancelScope()
    watch.watch(digest, admitted_expiry, scope)
    await _turns(lambda: scope.cancel_called)
    try:
        return scope.cancel_called
    finally:
        watch.unwatch(digest, scope)
        await watch.aclose()


async def test_a_stream_set_up_after_its_key_was_revoked_and_looked_up_again_ends_at_once() -> None:
    """Request A is admitted (key active) and waits in the queue. The key is revoked and announced:
    the watch has no stream of it yet, so the announcement does nothing there. Request B with the
    key is refused, which caches "revoked" for the TTL. A's generation then starts: the watch took
    the key as A's admission saw it and looked again only once that fresh entry turned stale, so A
    streamed on for a TTL with its key known revoked (a review)."""
    wall, record, store, auth, watch = _watched_key()
    digest = record.key_sha256
    assert (await auth.status(digest))[0] == "active"  # A's admission
    store.records[digest] = record.with_changes(revoked=wall.now)
    auth.invalidate(digest)
    watch.changed(digest)
    assert (await auth.status(digest))[0] == "revoked"  # B refused: cached
    assert await _cut_at_once(watch, digest, record.expires)  # A's generation starts


async def test_a_stream_set_up_past_a_rotation_grace_its_admission_did_not_know_ends_at_once() -> None:
    """The same for a rotation: A admitted before it (no expiry, as its admission saw the key), the
    key's grace end read and cached since by another request, A's generation set up past it: the
    watch took A's "no expiry" and looked a TTL later, a TTL past the grace (a review)."""
    wall, record, store, auth, watch = _watched_key()
    digest = record.key_sha256
    assert (await auth.status(digest))[0] == "active"  # A's admission: no expiry
    store.records[digest] = record.with_changes(expires=wall.now + 1.0, replaced_by="key_successor")
    auth.invalidate(digest)
    assert await auth.status(digest) == ("active", wall.now + 1.0)  # another request: cached
    wall.advance(2.0)  # A waited in the queue past the grace's end
    assert await _cut_at_once(watch, digest, record.expires)


@pytest.mark.parametrize("other_stream", ["still running", "just ended"])
async def test_a_stream_of_a_key_already_watched_is_judged_by_the_cache_too(
    other_stream: str,
) -> None:
    """As above, where the watch already holds the key: another stream of it is running, or ended
    a moment ago (the key is kept until its timer fires, so back-to-back streams set no timer
    each). The revocation's announcement was lost and the subscription re-established (every
    lookup forgotten, no look started); request B reads and caches "revoked". A's generation then
    started unjudged and streamed on until the old entry's TTL ended (an hour here; a review)."""
    wall, record, store, auth, watch = _watched_key()
    digest = record.key_sha256
    assert (await auth.status(digest))[0] == "active"  # C's and A's admissions
    other = anyio.CancelScope()
    watch.watch(digest, None, other)  # C streams
    if other_stream == "just ended":
        watch.unwatch(digest, other)
    store.records[digest] = record.with_changes(revoked=wall.now)
    # The announcement is lost; the subscription comes back (edge/keys/services.py's `changed`).
    auth.invalidate(None)
    watch.changed(None)
    assert (await auth.status(digest))[0] == "revoked"  # B refused: cached
    scope = anyio.CancelScope()
    watch.watch(digest, None, scope)  # A's generation starts
    await _turns(lambda: scope.cancel_called)
    try:
        assert scope.cancel_called
    finally:
        watch.unwatch(digest, scope)
        watch.unwatch(digest, other)
        await watch.aclose()


async def test_a_look_under_way_does_not_undo_the_cached_expiry_a_new_stream_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look at a key with a stream is under way (its store read held) when the key is rotated;
    the announcement is lost and the subscription comes back (every lookup and read forgotten,
    no look started). Request B reads and caches the grace's end; stream A of the key is set up
    and takes that expiry from the cache. The look from before the rotation, back last, is still
    the key's latest look (the watch's own update begins none): it sets the expiry back to none
    and the next look a TTL away, so A outlived the grace by up to a TTL (a review)."""
    due_in = _timer_delays(monkeypatch)
    clock, digest, store, auth, watch, other = await _rotated_during_a_look()
    auth.invalidate(None)  # the announcement lost, the subscription back
    watch.changed(None)
    b = asyncio.ensure_future(auth.status(digest))  # request B: a read of its own
    await _turns(lambda: len(store.held) == 2)
    store.held[1].set()
    assert await b == ("active", clock.now + 0.5)  # cached
    scope = anyio.CancelScope()
    watch.watch(digest, None, scope)  # A's generation starts: takes the cached grace end
    assert due_in[-1] <= 0.5
    store.held[0].set()  # the look from before the rotation comes back
    await _turns(lambda: False)
    try:
        assert due_in[-1] <= 0.5, due_in
    finally:
        watch.unwatch(digest, scope)
        watch.unwatch(digest, other)
        await watch.aclose()


async def test_a_look_a_streams_set_up_starts_names_no_request() -> None:
    """A look ends every stream of its key, so its lines belong to no one request: the timer's
    looks run in a context of their own. The look a stream's set-up starts (its key found revoked
    in the cache) ran in that request's context, and its `key_streams_ended` line, which ended
    another request's stream too, carried the one request_id of the stream set up last."""
    wall, record, store, auth, watch = _watched_key()
    digest = record.key_sha256
    assert (await auth.status(digest))[0] == "active"  # the admissions: cached for the TTL
    running = anyio.CancelScope()
    watch.watch(digest, record.expires, running)  # another request's stream of the key
    store.records[digest] = record.with_changes(revoked=wall.now)
    auth.invalidate(digest)
    assert (await auth.status(digest))[0] == "revoked"  # a request refused: cached
    later = anyio.CancelScope()

    async def set_up() -> None:
        structlog.contextvars.bind_contextvars(request_id="chatcmpl-later")  # as the pipeline binds it
        watch.watch(digest, record.expires, later)

    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        await asyncio.create_task(set_up())  # its own task, as each request has
        await _turns(lambda: running.cancel_called and later.cancel_called)
    watch.unwatch(digest, running)
    watch.unwatch(digest, later)
    await watch.aclose()
    [ended] = [e for e in logs if e["event"] == "key_streams_ended"]
    assert ended["streams"] == 2
    assert "request_id" not in ended, ended
