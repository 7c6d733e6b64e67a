"""The KeyStore contract and the key lifecycle, on SQLite and DynamoDB (dynalite) alike."""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from edge.errors import ApiError
from edge.keys.authenticator import Authenticator
from edge.keys.dynamodb import DynamoDBKeyStore, create_table_if_missing
from edge.keys.legacy import BadKeysFile, import_keys, parse_jsonl
from edge.keys.lifecycle import (
    KeyAlreadyRotated,
    KeyLifecycle,
    KeyNotActive,
    KeyNotFound,
    KeyNotRotatable,
)
from edge.keys.record import KeyRecord, UnknownTier, hash_key, key_id
from edge.keys.store import KeyStore
from tests.keys.conftest import SAME_ID, dynamodb_client, next_secrets
from tests.limiter.clock import ManualClock

pytestmark = pytest.mark.anyio

TIERS = ("free", "paid")


def lifecycle(store: KeyStore, clock: ManualClock | None = None, grace_s: float = 60.0) -> KeyLifecycle:
    if clock is None:
        return KeyLifecycle(store, TIERS, rotation_grace_s=grace_s)
    return KeyLifecycle(store, TIERS, rotation_grace_s=grace_s, clock=clock)


async def test_a_created_key_is_stored_hashed_and_authenticates(key_store: KeyStore) -> None:
    key, record = await lifecycle(key_store).create("alice", "paid", "laptop")
    assert key.startswith("fg-") and record.last4 == key[-4:]
    assert record.key_sha256 == hash_key(key) and key not in repr(record)
    principal = await Authenticator(key_store, 5.0).authenticate(f"Bearer {key}")
    assert (principal.user, principal.tier, principal.key_id) == ("alice", "paid", record.id)
    assert await key_store.by_id(record.id) == record
    assert await key_store.any_usable(time.time())


async def test_the_sqlite_file_never_holds_a_key(tmp_path: Path) -> None:
    from edge.keys.sqlite import SQLiteKeyStore

    store = SQLiteKeyStore(tmp_path / "keys.db")
    key, _ = await lifecycle(store).create("alice", "paid")
    await store.aclose()
    rows = sqlite3.connect(tmp_path / "keys.db").execute("SELECT * FROM api_keys").fetchall()
    assert key not in repr(rows) and hash_key(key) in repr(rows)


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Token abc", "Bearer fg-not-a-key"])
async def test_bad_credentials_are_401(key_store: KeyStore, header: str | None) -> None:
    await lifecycle(key_store).create("alice", "paid")
    with pytest.raises(ApiError) as info:
        await Authenticator(key_store, 5.0).authenticate(header)
    assert info.value.status == 401


async def test_list_never_shows_a_key_and_filters_by_user(key_store: KeyStore) -> None:
    keys = lifecycle(key_store)
    a, _ = await keys.create("alice", "paid", "one")
    await keys.create("bob", "free", "two")
    listed = await keys.list_keys()
    assert [(r.user, r.label) for r in listed] == [("alice", "one"), ("bob", "two")]
    assert [r.user for r in await keys.list_keys("bob")] == ["bob"]
    assert a not in repr(listed)


async def test_revoke_and_set_tier_reach_a_cache_once_its_ttl_is_over(key_store: KeyStore) -> None:
    clock = ManualClock()
    keys = lifecycle(key_store)
    key, record = await keys.create("alice", "free")
    auth = Authenticator(key_store, ttl_s=5.0, clock=clock)
    assert (await auth.authenticate(f"Bearer {key}")).tier == "free"

    await keys.set_tier(record.id, "paid")
    assert (await auth.authenticate(f"Bearer {key}")).tier == "free"  # cached, within the bound
    clock.advance(5.0)
    assert (await auth.authenticate(f"Bearer {key}")).tier == "paid"

    await keys.revoke(record.id)
    auth.invalidate(record.key_sha256)  # what a pub/sub announcement does
    with pytest.raises(ApiError, match="revoked") as info:
        await auth.authenticate(f"Bearer {key}")
    assert info.value.status == 401


@pytest.mark.parametrize("change", ["tier", "expires"])
async def test_a_revocation_is_never_undone_by_a_change_read_before_it(
    key_store: KeyStore, change: str
) -> None:
    """A tier change or a rotation writes back the record it read; an operator's revoke that landed
    in between stands (before, the key went on working: for good, or for the rotation's grace)."""
    keys = lifecycle(key_store)
    key, record = await keys.create("alice", "free")
    read = await key_store.by_id(record.id)  # the other operator's step read it ...
    assert read is not None
    await keys.revoke(record.id)  # ... then this one revoked it ...
    changed = (
        read.with_changes(tier="paid")
        if change == "tier"
        else read.with_changes(expires=read.created + 86400)
    )
    await key_store.put(changed)  # ... and the other step wrote back what it read, changed
    stored = await key_store.by_id(record.id)
    assert stored is not None and stored.revoked is not None
    with pytest.raises(ApiError, match="revoked"):
        await Authenticator(key_store, 5.0).authenticate(f"Bearer {key}")


async def test_rotation_keeps_the_old_key_for_the_grace_period(key_store: KeyStore) -> None:
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock, grace_s=60.0)
    old_key, old = await keys.create("alice", "paid", "ci")
    rotated = await keys.rotate(old.id)
    assert (rotated.new.user, rotated.new.tier, rotated.new.label) == ("alice", "paid", "ci")
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    assert (await auth.authenticate(f"Bearer {old_key}")).user == "alice"
    assert (await auth.authenticate(f"Bearer {rotated.key}")).user == "alice"
    clock.advance(60.0)
    with pytest.raises(ApiError, match=r"^This API key has expired\.$"):
        await auth.authenticate(f"Bearer {old_key}")
    assert (await auth.authenticate(f"Bearer {rotated.key}")).user == "alice"
    with pytest.raises(KeyNotFound):
        await keys.rotate(old.id)  # an expired key cannot be rotated again


async def test_a_key_is_rotated_once_and_its_replacement_keeps_the_keys_own_expiry(
    key_store: KeyStore,
) -> None:
    """A review: a second rotate of one key (a retry whose answer was lost) made a second
    replacement that inherited the grace's end as its expiry, and died with the old key, while the
    first replacement lived on. Refused now, naming the first; that one is rotated in turn if its
    key was lost, and every replacement keeps the expiry the key was created with."""
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock, grace_s=60.0)
    old_key, old = await keys.create("alice", "paid", "ci", expires_in_s=86400.0)
    first = await keys.rotate(old.id)
    with pytest.raises(KeyAlreadyRotated, match=f"its replacement is {first.new.id}") as refused:
        await keys.rotate(old.id)  # the retry
    assert refused.value.replaced_by == first.new.id
    assert first.new.expires == old.expires and first.old.replaced_by == first.new.id
    listed = {r.id: r for r in await keys.list_keys("alice")}
    assert set(listed) == {old.id, first.new.id}  # no second replacement
    assert listed[old.id].replaced_by == first.new.id and listed[first.new.id].replaced_by is None

    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    clock.advance(60.0)  # the grace ends: the old key with it, the replacement lives on
    with pytest.raises(ApiError, match="expired"):
        await auth.authenticate(f"Bearer {old_key}")
    assert (await auth.authenticate(f"Bearer {first.key}")).key_id == first.new.id
    second = await keys.rotate(first.new.id)  # the replacement's key was lost: rotate it in turn
    assert second.new.expires == old.expires


async def test_revoking_a_replacement_ends_the_grace_of_the_keys_it_replaced(key_store: KeyStore) -> None:
    """A review: revoking a rotation's new key left the old one working to the end of its grace,
    though the owner had cut off that credential. Every key the revoked one replaced, directly or
    through earlier rotations, is revoked with it; its own replacement (were it rotated) is not."""
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock, grace_s=3600.0)
    first_key, first = await keys.create("alice", "paid")
    second = await keys.rotate(first.id)
    third = await keys.rotate(second.new.id)
    other_key, _ = await keys.create("alice", "paid")  # another key of the user's: not this line
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    for key in (first_key, second.key, third.key):
        assert (await auth.authenticate(f"Bearer {key}")).user == "alice"  # all in their grace

    await keys.revoke(third.new.id)
    for key in (first_key, second.key, third.key):
        with pytest.raises(ApiError, match="revoked"):
            await auth.authenticate(f"Bearer {key}")
    assert (await auth.authenticate(f"Bearer {other_key}")).user == "alice"


async def test_revoking_a_key_in_its_grace_leaves_its_replacement(key_store: KeyStore) -> None:
    """Ending an old key's grace early is what revoking it is for: the new key lives on."""
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock, grace_s=3600.0)
    old_key, old = await keys.create("alice", "paid")
    rotated = await keys.rotate(old.id)
    await keys.revoke(old.id)
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    with pytest.raises(ApiError, match="revoked"):
        await auth.authenticate(f"Bearer {old_key}")
    assert (await auth.authenticate(f"Bearer {rotated.key}")).key_id == rotated.new.id


async def test_only_an_active_keys_tier_can_be_set(key_store: KeyStore) -> None:
    """A revoked or expired key is refused for good: a tier for it changes nothing anyone can use,
    and a 200 said otherwise."""
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock)
    _, revoked = await keys.create("alice", "free")
    await keys.revoke(revoked.id)
    _, expiring = await keys.create("alice", "free", expires_in_s=10.0)
    clock.advance(10.0)
    for record, status in ((revoked, "revoked"), (expiring, "expired")):
        with pytest.raises(KeyNotActive, match=f"is {status}"):
            await keys.set_tier(record.id, "paid")
        stored = await key_store.by_id(record.id)
        assert stored is not None and stored.tier == "free"


class _HeldPut:
    """The real store, its first write of a key (put, or a rotation's retire) held until the test
    lets it through: one rotation or tier change stopped between reading the key and writing it
    back, while another runs."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.puts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def _held(self) -> None:
        self.puts += 1
        if self.puts == 1:
            self.entered.set()
            await self.gate.wait()

    async def put(self, record: KeyRecord) -> None:
        await self._held()
        await self.store.put(record)

    async def retire(self, key_sha256: str, replaced_by: str, expires: float) -> KeyRecord | None:
        await self._held()
        return await self.store.retire(key_sha256, replaced_by, expires)


def _racing(store: KeyStore) -> tuple[ManualClock, _HeldPut, KeyLifecycle, KeyLifecycle]:
    """Two lifecycles on one store and clock: `slow`'s first write held (`held`), `fast`'s not."""
    clock = ManualClock(1_000_000.0)
    held = _HeldPut(store)
    slow = KeyLifecycle(held, TIERS, rotation_grace_s=60.0, clock=clock)  # type: ignore[arg-type]
    return clock, held, slow, lifecycle(store, clock, grace_s=60.0)


async def test_two_rotations_at_once_make_one_replacement(key_store: KeyStore) -> None:
    """Two operators rotate one key at once: both read it unreplaced. The store keeps the first
    replacement written; the other rotation is refused naming it, and its own new key, never
    shown, is revoked rather than left working unseen."""
    clock, held, slow, fast = _racing(key_store)
    old_key, old = await fast.create("alice", "paid")
    losing = asyncio.create_task(slow.rotate(old.id))
    await held.entered.wait()  # it read the key and added its new one; its write waits
    won = await fast.rotate(old.id)
    held.gate.set()
    with pytest.raises(KeyAlreadyRotated, match=won.new.id):
        await losing
    stored = await key_store.by_id(old.id)
    assert stored is not None and stored.replaced_by == won.new.id and stored.expires == won.old.expires

    listed = await fast.list_keys("alice")
    [lost] = [r for r in listed if r.id not in (old.id, won.new.id)]
    assert lost.revoked is not None
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    assert (await auth.authenticate(f"Bearer {won.key}")).key_id == won.new.id
    assert (await auth.authenticate(f"Bearer {old_key}")).key_id == old.id  # in its grace
    # The losing key names the old one as the key it meant to replace, but never replaced it: an
    # operator's revoke of it leaves the old key's grace alone.
    await fast.revoke(lost.id)
    assert (await auth.authenticate(f"Bearer {old_key}")).key_id == old.id


async def test_a_key_revoked_while_a_rotation_runs_gets_no_live_replacement(key_store: KeyStore) -> None:
    """A review: revoke (a leaked key) landing between a rotation's read and its write. The
    rotation's write (KeyStore.retire) asked only for no replacement, so the revoked key was marked
    replaced and the rotation answered with a new key that worked: the leak's holder, or whoever
    ran the rotation, went on with a live credential the operator had just cut off."""
    clock, held, slow, fast = _racing(key_store)
    _, old = await fast.create("alice", "paid")
    rotating = asyncio.create_task(slow.rotate(old.id))
    await held.entered.wait()  # it read the key active and added its new one; its write waits
    await fast.revoke(old.id)
    held.gate.set()
    with pytest.raises(KeyNotRotatable, match="is revoked"):
        await rotating
    listed = await fast.list_keys("alice")
    assert [r.status(clock()) for r in listed] == ["revoked", "revoked"]
    stored = await key_store.by_id(old.id)
    assert stored is not None and stored.replaced_by is None


async def test_a_change_read_before_a_rotation_keeps_the_rotation(key_store: KeyStore) -> None:
    """A tier change that read the key before a rotation writes it back after: the rotation's grace
    expiry and replacement stand (before, the retiring key went on working for good)."""
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock, grace_s=60.0)
    old_key, old = await keys.create("alice", "free")
    read = await key_store.by_id(old.id)  # the other operator's set-tier read it ...
    assert read is not None
    rotated = await keys.rotate(old.id)  # ... this one rotated it ...
    await key_store.put(read.with_changes(tier="paid"))  # ... and the set-tier wrote back
    clock.advance(60.0)
    with pytest.raises(ApiError, match="expired"):
        await Authenticator(key_store, ttl_s=1e-9, wall_clock=clock).authenticate(f"Bearer {old_key}")
    stored = await key_store.by_id(old.id)
    assert stored is not None
    assert (stored.replaced_by, stored.expires) == (rotated.new.id, rotated.old.expires)


async def _tiers(auth: Authenticator, *keys: str) -> list[str]:
    return [(await auth.authenticate(f"Bearer {key}")).tier for key in keys]


async def test_a_tier_change_during_a_rotations_grace_moves_both_keys(key_store: KeyStore) -> None:
    """A review: set-tier on the old key during the grace left the replacement, which the user
    moves to, at the old tier for good; on the new key, it left the old key (still in use for the
    grace) at the old tier. A key and its replacement are one credential: both move."""
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock, grace_s=60.0)
    old_key, old = await keys.create("alice", "free")
    rotated = await keys.rotate(old.id)
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)

    assert (await keys.set_tier(old.id, "paid")).tier == "paid"  # the id the operator knows
    assert await _tiers(auth, old_key, rotated.key) == ["paid", "paid"]
    await keys.set_tier(rotated.new.id, "free")
    assert await _tiers(auth, old_key, rotated.key) == ["free", "free"]

    clock.advance(60.0)  # the grace is over: the old key is history, left as it was
    await keys.set_tier(rotated.new.id, "paid")
    stored = await key_store.by_id(old.id)
    assert stored is not None and stored.tier == "free"
    assert await _tiers(auth, rotated.key) == ["paid"]


@pytest.mark.parametrize("waits", ["rotation", "tier change"])
async def test_a_tier_change_racing_a_rotation_reaches_both_keys(key_store: KeyStore, waits: str) -> None:
    """A tier change and a rotation of one key at once, each read before the other wrote. Before:
    the rotation wrote back the key as it read it, undoing the tier change (`rotation` waits), or
    the tier change found no replacement yet and the new key kept the old tier (`tier change`)."""
    clock, held, slow, fast = _racing(key_store)
    old_key, old = await fast.create("alice", "free")
    if waits == "rotation":
        rotating = asyncio.create_task(slow.rotate(old.id))
        await held.entered.wait()  # it read the key and stored its new one; its write waits
        await fast.set_tier(old.id, "paid")
        held.gate.set()
        rotated = await rotating
    else:
        moving = asyncio.create_task(slow.set_tier(old.id, "paid"))
        await held.entered.wait()  # it read the key; its write waits
        rotated = await fast.rotate(old.id)
        held.gate.set()
        await moving
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    assert await _tiers(auth, old_key, rotated.key) == ["paid", "paid"]


class _HeldWrites(_HeldPut):
    """As _HeldPut, but every write (put or retire) waits for a gate of its own: writes[n] for the
    n-th, so a test lets one operation through a step at a time."""

    def __init__(self, store: KeyStore, count: int) -> None:
        super().__init__(store)
        self.reached = [asyncio.Event() for _ in range(count)]
        self.writes = [asyncio.Event() for _ in range(count)]

    async def _held(self) -> None:
        self.puts += 1
        if self.puts <= len(self.writes):
            self.reached[self.puts - 1].set()
            await self.writes[self.puts - 1].wait()


async def test_a_rotation_gives_its_new_key_the_latest_tier_change(key_store: KeyStore) -> None:
    """A review: a rotation gave its new key a tier change that landed after it read the old key,
    as the old key's tier read at its own write; a second tier change landing before the new key
    was written found the new key still at the tier it was made with, and left it. The rotation
    then wrote the first change's tier: the new key kept it for good, the second undone."""
    clock = ManualClock(1_000_000.0)
    held = _HeldWrites(key_store, 2)
    slow = KeyLifecycle(held, TIERS, rotation_grace_s=60.0, clock=clock)  # type: ignore[arg-type]
    fast = lifecycle(key_store, clock, grace_s=60.0)
    old_key, old = await fast.create("alice", "free")
    rotating = asyncio.create_task(slow.rotate(old.id))
    await held.reached[0].wait()  # it read the key and stored its new one (free); retire waits
    await fast.set_tier(old.id, "paid")  # no replacement to move yet
    held.writes[0].set()
    await held.reached[1].wait()  # retire read paid; the new key's write of it waits
    await fast.set_tier(old.id, "free")
    held.writes[1].set()
    rotated = await rotating
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    assert await _tiers(auth, old_key, rotated.key) == ["free", "free"]
    assert rotated.new.tier == "free"


async def _one_key_per_id(store: KeyStore, *records: KeyRecord) -> None:
    listed = await store.list_keys()
    assert sorted(r.id for r in listed) == sorted({r.id for r in listed})
    for record in records:
        assert await store.by_id(record.id) == await store.get(record.key_sha256)


async def test_a_new_key_whose_id_is_taken_is_made_again(
    key_store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh key's id (48 bits of its hash) may be a stored key's. Before: on SQLite the insert
    was refused, unread, and the key handed out unstored (refused by every edge); on DynamoDB it was
    stored beside the other under one id, which revoke then named either of."""
    first, second = SAME_ID
    assert key_id(hash_key(first)) == key_id(hash_key(second))
    next_secrets(monkeypatch, first, second)
    keys = lifecycle(key_store)
    _, alice = await keys.create("alice", "paid")
    bob_key, bob = await keys.create("bob", "free")  # drew `second`, alice's id: made again
    auth = Authenticator(key_store, ttl_s=1e-9)
    assert (await auth.authenticate(f"Bearer {bob_key}")).user == "bob"
    assert bob_key != second and bob.id != alice.id
    await _one_key_per_id(key_store, alice, bob)
    await keys.revoke(bob.id)
    assert (await auth.authenticate(f"Bearer {first}")).user == "alice"


async def test_a_rotation_never_hands_over_to_another_keys_id(
    key_store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, on SQLite, the old key was marked replaced by alice's key and expired after the
    grace, while the new key, never stored, was refused: carol was locked out."""
    first, second = SAME_ID
    next_secrets(monkeypatch, first, None, second)
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock, grace_s=60.0)
    _, alice = await keys.create("alice", "paid")
    _, carol = await keys.create("carol", "free")
    rotated = await keys.rotate(carol.id)  # drew `second`, alice's id: made again
    clock.advance(60.0)
    auth = Authenticator(key_store, ttl_s=1e-9, wall_clock=clock)
    assert (await auth.authenticate(f"Bearer {rotated.key}")).user == "carol"
    assert rotated.old.replaced_by == rotated.new.id != alice.id
    await _one_key_per_id(key_store, alice, carol, rotated.new)
    assert (await auth.authenticate(f"Bearer {first}")).user == "alice"


async def test_an_imported_key_whose_id_is_taken_takes_a_longer_one(
    key_store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its hash is given, so it cannot be made again. Before: SQLite dropped it and counted it as
    already in the store; DynamoDB stored it beside the other under one id."""
    first, second = SAME_ID
    next_secrets(monkeypatch, first)
    _, alice = await lifecycle(key_store).create("alice", "paid")
    line = json.dumps({"key_sha256": hash_key(second), "user": "carol", "tier": "free"})
    done = await import_keys(key_store, parse_jsonl([line]))
    assert (done.added, done.present) == (1, 0)
    auth = Authenticator(key_store, ttl_s=1e-9)
    carol = await auth.authenticate(f"Bearer {second}")
    assert carol.user == "carol" and carol.key_id.startswith(alice.id) and carol.key_id != alice.id
    await _one_key_per_id(key_store, alice)
    again = await import_keys(key_store, parse_jsonl([line]))  # still idempotent
    assert (again.added, again.present) == (0, 1)
    assert len(await key_store.list_keys()) == 2


def _record_of(key: str, user: str) -> KeyRecord:
    digest = hash_key(key)
    return KeyRecord(key_id(digest), digest, user, "free", created=1.0, last4=key[-4:])


async def test_on_dynamodb_an_id_is_one_keys_whatever_the_order_of_two_adds(
    dynalite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No condition on a key's item can refuse its id (not a key of the table): an add looked for
    the id, then wrote. Two adds of one id at once both found it free; and a key an older edge
    stored (no claim of its id) is found all the same."""
    client = dynamodb_client(dynalite_endpoint)
    table = f"keys-{secrets.token_hex(4)}"
    create_table_if_missing(client, table)  # type: ignore[arg-type]
    store = DynamoDBKeyStore(client, table)  # type: ignore[arg-type]
    first, second = (_record_of(key, user) for key, user in zip(SAME_ID, ("alice", "bob"), strict=True))
    looked, go_on = threading.Event(), threading.Event()
    look = store._scan

    def held_look(*args: Any) -> list[KeyRecord]:
        found = look(*args)
        if not looked.is_set():  # the first add found the id free; it waits to write
            looked.set()
            go_on.wait(10.0)
        return found

    monkeypatch.setattr(store, "_scan", held_look)
    try:
        adding = asyncio.create_task(store.add(first))
        await anyio.to_thread.run_sync(looked.wait, 5.0)
        assert await store.add(second)  # found it free too, and wrote first
        go_on.set()
        assert not await adding
        assert [r.user for r in await store.list_keys()] == ["bob"]

        older = _record_of("fg-an-older-edges-key", "carol")
        await store.put(older)  # as an edge before claims stored it
        assert not await store.add(older.with_changes(key_sha256=hash_key("fg-another-key")))
        assert {r.user for r in await store.list_keys()} == {"bob", "carol"}
    finally:
        go_on.set()
        await store.aclose()


async def test_on_dynamodb_a_key_is_found_by_its_id_without_a_scan(
    dynalite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: by_id scanned the whole table (keys and every usage record) for each revoke,
    rotate and set-tier, though an id's claim names its key's hash: two reads. The scan is left for
    ids no claim names (a key an edge before claims stored)."""
    client = dynamodb_client(dynalite_endpoint)
    table = f"keys-{secrets.token_hex(4)}"
    create_table_if_missing(client, table)  # type: ignore[arg-type]
    store = DynamoDBKeyStore(client, table)  # type: ignore[arg-type]
    scans = 0
    scan = client.scan  # type: ignore[attr-defined]

    def counted(**params: Any) -> Any:
        nonlocal scans
        scans += 1
        return scan(**params)

    monkeypatch.setattr(client, "scan", counted)
    try:
        keys = lifecycle(store)
        _, made = await keys.create("alice", "paid")
        scans = 0
        assert await store.by_id(made.id) == made
        assert (await keys.revoke(made.id)).revoked is not None
        assert scans == 0

        older = _record_of("fg-an-older-edges-key", "carol")
        await store.put(older)  # as an edge before claims stored it: no claim names its id
        assert await store.by_id(older.id) == older
        assert await store.by_id("key_000000000000") is None
        assert scans == 2

        # A claim whose key was never written (its add failed after the claim): no key has the id.
        dangling = _record_of("fg-a-key-whose-write-failed", "dan")
        client.put_item(  # type: ignore[attr-defined]
            TableName=table,
            Item={"pk": {"S": f"key_id#{dangling.id}"}, "sk": {"S": "key_id"}, "kind": {"S": "key_id"}}
            | {"key_sha256": {"S": dangling.key_sha256}},
        )
        with pytest.raises(KeyNotFound):
            await keys.revoke(dangling.id)
        assert scans == 3
    finally:
        await store.aclose()


async def test_an_id_longer_than_any_keys_is_not_found(key_store: KeyStore) -> None:
    """A review: on DynamoDB by_id reads the id's claim, whose partition key (`key_id#<id>`) may be
    at most 2048 bytes; a longer id (a typo, a pasted key, in an admin URL) was a ValidationException,
    a 500 for revoke, rotate and set-tier. The scan it replaced took any id."""
    keys = lifecycle(key_store)
    await keys.create("alice", "paid")
    long_id = "key_" + "a" * 3000
    assert await key_store.by_id(long_id) is None
    for change in (keys.revoke(long_id), keys.rotate(long_id), keys.set_tier(long_id, "free")):
        with pytest.raises(KeyNotFound):
            await change


# The api_keys table as edges before `replaced_by` made it.
_OLD_SCHEMA = """
CREATE TABLE api_keys (
    key_sha256 TEXT PRIMARY KEY, id TEXT NOT NULL UNIQUE, user TEXT NOT NULL, tier TEXT NOT NULL,
    label TEXT NOT NULL, created REAL NOT NULL, expires REAL, revoked REAL, last4 TEXT NOT NULL
) WITHOUT ROWID
"""


async def test_a_sqlite_file_of_an_older_edge_gains_the_replacement_column(tmp_path: Path) -> None:
    from edge.keys.sqlite import SQLiteKeyStore

    path = tmp_path / "keys.db"
    old_key = "fg-a-key-an-older-edge-made"
    digest = hash_key(old_key)
    with sqlite3.connect(path) as conn:
        conn.execute(_OLD_SCHEMA)
        conn.execute(
            "INSERT INTO api_keys VALUES (?,?,?,?,?,?,?,?,?)",
            (digest, key_id(digest), "alice", "paid", "", 1.0, None, None, old_key[-4:]),
        )
    conn.close()
    store, other = SQLiteKeyStore(path), SQLiteKeyStore(path)  # an edge and the CLI, say
    try:
        keys = lifecycle(store)
        assert (await Authenticator(store, 1e-9).authenticate(f"Bearer {old_key}")).user == "alice"
        rotated = await keys.rotate(key_id(digest))
        with pytest.raises(KeyAlreadyRotated):
            await lifecycle(other).rotate(key_id(digest))
        assert rotated.new.id in {r.id for r in await other.list_keys("alice")}
    finally:
        await store.aclose()
        await other.aclose()


async def test_unknown_ids_and_tiers_are_refused(key_store: KeyStore) -> None:
    keys = lifecycle(key_store)
    with pytest.raises(UnknownTier, match="platinum"):
        await keys.create("alice", "platinum")
    _, record = await keys.create("alice", "free")
    with pytest.raises(UnknownTier):
        await keys.set_tier(record.id, "platinum")
    for step in (keys.revoke, keys.rotate):
        with pytest.raises(KeyNotFound):
            await step("key_000000000000")


async def test_importing_the_old_keys_file_adds_keys_but_never_revives_one(key_store: KeyStore) -> None:
    legacy_key = "fg-legacy-key-from-the-secret"
    line = json.dumps({"key_sha256": hash_key(legacy_key), "user": "carol", "tier": "free", "created": 1.0})
    done = await import_keys(key_store, parse_jsonl([line, ""]))
    assert (done.added, done.present) == (1, 0)
    auth = Authenticator(key_store, ttl_s=1e-9)
    principal = await auth.authenticate(f"Bearer {legacy_key}")
    assert principal.user == "carol"

    await lifecycle(key_store).revoke(principal.key_id)
    again = await import_keys(key_store, parse_jsonl([line]))
    assert (again.added, again.present) == (0, 1)
    with pytest.raises(ApiError, match="revoked"):
        await auth.authenticate(f"Bearer {legacy_key}")


@pytest.mark.parametrize("user", ["", "  "])
def test_the_old_keys_file_may_not_give_a_key_no_user(user: str) -> None:
    """Imported, two such keys shared one nameless user: each read the other's conversations and
    usage and could cancel its requests (a review); a key created here is refused one."""
    line = json.dumps({"key_sha256": hash_key("fg-legacy-alice"), "user": user, "tier": "paid"})
    with pytest.raises(BadKeysFile, match="line 2: user must not be empty"):
        parse_jsonl([json.dumps({"key_sha256": hash_key("fg-b"), "user": "bob", "tier": "paid"}), line])


@pytest.mark.parametrize("digest", ["g" * 64, " " + "a" * 63])
def test_the_old_keys_file_may_only_give_a_sha256_hex_digest(digest: str) -> None:
    """64 characters that are no hex digest passed, and were imported as a key nothing matches."""
    line = json.dumps({"key_sha256": digest, "user": "bob", "tier": "paid"})
    with pytest.raises(BadKeysFile, match="line 1: key_sha256 is not a SHA-256 hex digest"):
        parse_jsonl([line])
    assert [k.user for k in parse_jsonl([line.replace(digest, hash_key("k").upper())])] == ["bob"]


class _GatedStore:
    """The real store, its reads counted and their answers held until the test opens the gate."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self.reads = 0
        self.failing = False
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def get(self, key_sha256: str) -> KeyRecord | None:
        self.reads += 1
        if self.failing:
            raise ConnectionError("the key store is unreachable")
        record = await self.store.get(key_sha256)
        self.entered.set()
        await self.gate.wait()
        return record


async def test_concurrent_requests_of_one_key_share_one_store_read(key_store: KeyStore) -> None:
    key, record = await lifecycle(key_store).create("alice", "paid")
    store = _GatedStore(key_store)
    auth = Authenticator(store, ttl_s=5.0)  # type: ignore[arg-type]
    first = asyncio.create_task(auth.authenticate(f"Bearer {key}"))
    await store.entered.wait()
    others = [asyncio.create_task(auth.authenticate(f"Bearer {key}")) for _ in range(15)]
    first.cancel()  # its client went away: the read goes on for the others
    store.gate.set()
    principals = await asyncio.gather(*others)
    assert {p.key_id for p in principals} == {record.id}
    assert store.reads == 1
    with pytest.raises(asyncio.CancelledError):
        await first
    await auth.authenticate(f"Bearer {key}")  # cached: no read
    assert store.reads == 1


async def test_a_key_invalidated_during_its_read_is_read_again(key_store: KeyStore) -> None:
    keys = lifecycle(key_store)
    key, record = await keys.create("alice", "free")
    store = _GatedStore(key_store)
    auth = Authenticator(store, ttl_s=5.0)  # type: ignore[arg-type]
    before = asyncio.create_task(auth.authenticate(f"Bearer {key}"))
    await store.entered.wait()
    await keys.revoke(record.id)
    auth.invalidate(record.key_sha256)  # announced while the read was under way
    store.gate.set()
    assert (await before).key_id == record.id  # what the store held when it was read
    with pytest.raises(ApiError, match="revoked"):
        await auth.authenticate(f"Bearer {key}")
    assert store.reads == 2


async def test_a_failed_read_is_a_503_for_every_waiting_request_and_is_not_kept(key_store: KeyStore) -> None:
    key, _ = await lifecycle(key_store).create("alice", "paid")
    store = _GatedStore(key_store)
    auth = Authenticator(store, ttl_s=5.0)  # type: ignore[arg-type]
    store.failing = True
    store.gate.set()
    results = await asyncio.gather(
        *(auth.authenticate(f"Bearer {key}") for _ in range(4)), return_exceptions=True
    )
    assert [getattr(r, "status", r) for r in results] == [503] * 4
    assert store.reads == 1
    store.failing = False
    assert (await auth.authenticate(f"Bearer {key}")).user == "alice"  # read again, not a kept failure
    assert store.reads == 2


async def test_keys_are_listed_a_page_at_a_time_in_id_order(key_store: KeyStore) -> None:
    keys = lifecycle(key_store)
    alices = sorted([(await keys.create("alice", "paid"))[1].id for _ in range(5)])
    bobs = [(await keys.create("bob", "free"))[1].id for _ in range(2)]

    seen: list[str] = []
    after: str | None = None
    while True:
        page = await key_store.page_keys("alice", after, 2)
        assert len(page.keys) <= 2 and {r.user for r in page.keys} <= {"alice"}
        seen += [r.id for r in page.keys]
        if not page.has_more:
            break
        after = page.keys[-1].id
    assert seen == alices

    everyone = await key_store.page_keys(None, None, 100)
    assert [r.id for r in everyone.keys] == sorted(alices + bobs) and not everyone.has_more
    exact = await key_store.page_keys(None, None, 7)
    assert len(exact.keys) == 7 and not exact.has_more
    assert (await key_store.page_keys("carol", None, 5)).keys == []
    past = await key_store.page_keys(None, max(alices + bobs), 5)
    assert past.keys == [] and not past.has_more


async def test_a_dynamodb_page_of_a_users_keys_is_one_query_not_a_scan(dynalite_endpoint: str) -> None:
    client: Any = dynamodb_client(dynalite_endpoint)
    table = f"keys-{secrets.token_hex(4)}"
    create_table_if_missing(client, table)
    store = DynamoDBKeyStore(client, table)
    keys = lifecycle(store)
    for user in ("alice", "alice", "bob"):
        await keys.create(user, "paid")
    calls: list[str] = []
    client.meta.events.register("before-call.dynamodb.*", lambda model, **_: calls.append(model.name))
    page = await store.page_keys("alice", None, 1)
    assert len(page.keys) == 1 and page.has_more
    rest = await store.page_keys("alice", page.keys[0].id, 100)
    assert len(rest.keys) == 1 and not rest.has_more
    everyone = await store.page_keys(None, None, 100)
    assert len(everyone.keys) == 3
    assert calls == ["Query", "Query", "Query"]
    await store.aclose()


async def test_only_a_key_that_works_counts_as_usable(key_store: KeyStore) -> None:
    """What `serve` makes its development key by: a store of revoked and expired keys has none that
    works, and counted as holding one, no key was made and every request was refused."""
    clock = ManualClock(1_000_000.0)
    keys = lifecycle(key_store, clock)
    assert not await key_store.any_usable(clock())
    _, revoked = await keys.create("alice", "paid")
    await keys.revoke(revoked.id)
    assert not await key_store.any_usable(clock())
    await keys.create("bob", "paid", expires_in_s=60)
    assert await key_store.any_usable(clock())
    assert not await key_store.any_usable(clock() + 60)  # expired at its expiry, as KeyRecord.status says
    await keys.create("carol", "paid")
    assert await key_store.any_usable(clock() + 60)
