"""Today's keys.jsonl (hashes, one JSON object per line, as the Secrets Manager secret holds them)
into the key store. Insert-only and idempotent: a key already in the store, revoked or retiered since,
is left as it is, so importing the old file again never brings a revoked key back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from edge.keys.record import KeyRecord, key_id
from edge.keys.store import KeyStore


class LegacyKey(msgspec.Struct):
    key_sha256: str
    user: str
    tier: str
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class Imported:
    added: int
    present: int  # already in the store (left unchanged)


class BadKeysFile(ValueError):
    """A line that is no key record: the import stops before writing anything."""


def parse_jsonl(lines: Iterable[str | bytes]) -> list[LegacyKey]:
    decoder = msgspec.json.Decoder(LegacyKey)
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            key = decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise BadKeysFile(f"line {number}: {exc}") from None
        if len(key.key_sha256) != 64:
            raise BadKeysFile(f"line {number}: key_sha256 is not a SHA-256 hex digest")
        if not key.user.strip():
            # As a key created here (lifecycle.InvalidUser): keys of no one would share one
            # nameless user's conversations, usage, requests to cancel and limits.
            raise BadKeysFile(f"line {number}: user must not be empty")
        found.append(key)
    return found


async def import_keys(store: KeyStore, keys: list[LegacyKey]) -> Imported:
    added = 0
    for k in keys:
        digest = k.key_sha256.lower()
        record = KeyRecord(id=key_id(digest), key_sha256=digest, user=k.user, tier=k.tier, created=k.created)
        added += await store.add(record)
    return Imported(added, len(keys) - added)


async def import_keys_file_into(store: KeyStore, keys_file: str) -> Imported:
    """`[server] keys_file`, when it exists (today's JSONL, written from the Secrets Manager secret
    at task start): imported at every start and by every key command, insert-only."""
    path = Path(keys_file) if keys_file else None
    if path is None or not path.is_file():
        return Imported(0, 0)
    return await import_keys(store, parse_jsonl(path.read_bytes().splitlines()))
