"""The KeyStore contract and the key lifecycle, on SQLite and DynamoDB (dynalite) alike."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from edge.errors import ApiError
from edge.keys.authenticator import Authenticator
from edge.keys.legacy import import_keys, parse_jsonl
from edge.keys.lifecycle import KeyLifecycle, KeyNotFound, UnknownTier
from edge.keys.record import KeyRecord, hash_key
from edge.keys.store import KeyStore
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
    assert await key_store.any()


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
