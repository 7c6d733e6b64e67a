"""API keys stored hashed, and the registry that answers cancel requests."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from edge.auth import KeyStore, Principal, create_key
from edge.cancel import CancelOutcome, CancelRegistry
from edge.errors import ApiError


def test_keys_are_stored_hashed_and_authenticate(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.jsonl"
    key = create_key(keys_file, "alice", "paid")
    stored = keys_file.read_text()
    assert key not in stored
    assert hashlib.sha256(key.encode()).hexdigest() in stored
    store = KeyStore(keys_file)
    assert store.authenticate(f"Bearer {key}") == Principal("alice", "paid")


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Token abc", "Bearer fg-not-a-key"])
def test_bad_credentials_are_401(tmp_path: Path, header: str | None) -> None:
    keys_file = tmp_path / "keys.jsonl"
    create_key(keys_file, "alice", "paid")
    with pytest.raises(ApiError) as info:
        KeyStore(keys_file).authenticate(header)
    assert info.value.status == 401


def test_keys_added_later_are_picked_up(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.jsonl"
    store = KeyStore(keys_file)
    assert not store.has_keys()
    key = create_key(keys_file, "bob", "free")
    assert store.authenticate(f"bearer {key}").user == "bob"


def test_cancel_registry_outcomes() -> None:
    registry = CancelRegistry()
    live = registry.register("r1", "alice")
    assert registry.cancel_local("r1", "mallory") is CancelOutcome.NOT_FOUND
    assert registry.cancel_local("nope", "alice") is CancelOutcome.NOT_FOUND
    assert registry.cancel_local("r1", "alice") is CancelOutcome.CANCELLED
    assert live.cancelled
    registry.finish(live)
    assert registry.cancel_local("r1", "alice") is CancelOutcome.FINISHED
    assert registry.cancel_local("r1", "mallory") is CancelOutcome.NOT_FOUND
    assert len(registry) == 0


def test_finished_ids_are_bounded() -> None:
    registry = CancelRegistry(finished_capacity=2)
    for rid in ("a", "b", "c"):
        registry.finish(registry.register(rid, "u"))
    assert registry.cancel_local("a", "u") is CancelOutcome.NOT_FOUND
    assert registry.cancel_local("c", "u") is CancelOutcome.FINISHED
