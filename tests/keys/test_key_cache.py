"""The edge's key cache (edge/keys/authenticator.py) in front of a real key store (SQLite): what a
flood of made-up keys costs the users whose keys are real."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

import edge.keys.authenticator as authenticator
from edge.keys.authenticator import Authenticator
from edge.keys.record import KeyRecord, new_record
from edge.keys.sqlite import SQLiteKeyStore


class CountedStore(SQLiteKeyStore):
    """The real store, its reads counted."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads = 0

    async def get(self, key_sha256: str) -> KeyRecord | None:
        self.reads += 1
        return await super().get(key_sha256)


@pytest.mark.anyio
async def test_a_flood_of_unknown_keys_does_not_push_real_keys_out_of_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One cache for both: more made-up keys than it holds evicted every real key, and each real
    user's next request read the store again (DynamoDB: a billed read each)."""
    monkeypatch.setattr(authenticator, "MAX_CACHED", 4)
    monkeypatch.setattr(authenticator, "MAX_UNKNOWN", 4)
    store = CountedStore(tmp_path / "keys.db")
    real = []
    for i in range(3):
        key, record = new_record(f"user-{i}", "paid")
        assert await store.add(record)
        real.append(key)
    auth = Authenticator(store, ttl_s=3600)
    for key in real:
        assert (await auth.authenticate(f"Bearer {key}")).tier == "paid"
    assert store.reads == 3
    made_up = [f"sk-{secrets.token_hex(16)}" for _ in range(50)]
    for key in made_up:
        with pytest.raises(authenticator.ApiError) as refused:
            await auth.authenticate(f"Bearer {key}")
        assert refused.value.status == 401
    assert store.reads == 53
    for key in real:  # from the cache still
        assert (await auth.authenticate(f"Bearer {key}")).user.startswith("user-")
    assert store.reads == 53
    # The unknown keys' cache is bounded as the known keys' is: the last made-up key is still
    # cached, the first was pushed out and is read again.
    for key in (made_up[-1], made_up[0]):
        with pytest.raises(authenticator.ApiError):
            await auth.authenticate(f"Bearer {key}")
    assert store.reads == 54
    await store.aclose()
