"""Today's keys.jsonl (hashes, one JSON object per line, as the Secrets Manager secret holds them)
into the key store. Insert-only and idempotent: a key already in the store, revoked or retiered since,
is left as it is, so importing the old file again never brings a revoked key back."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from edge.keys.record import (
    ID_CHARS,
    InvalidUser,
    KeyRecord,
    UnknownTier,
    checked_user,
    is_key_hash,
    key_id,
)
from edge.keys.store import KeyIdTaken, KeyStore


class LegacyKey(msgspec.Struct):
    key_sha256: str
    user: str
    tier: str
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class Imported:
    new: tuple[str, ...]  # the hashes of the keys added
    present: int  # already in the store (left unchanged)

    @property
    def added(self) -> int:
        return len(self.new)


class BadKeysFile(ValueError):
    """A line that is no key record: the import stops before writing anything."""


def parse_jsonl(lines: Iterable[str | bytes], tiers: Collection[str] | None = None) -> list[LegacyKey]:
    """The file's keys; BadKeysFile naming the first line that is no key. With `tiers` (`keys
    import`), a tier not among them too: it imported, and every request of that key was a 403."""
    decoder = msgspec.json.Decoder(LegacyKey)
    found = []
    seen: dict[str, tuple[int, LegacyKey]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            key = decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise BadKeysFile(f"line {number}: {exc}") from None
        # Hex as well as 64 long: any other such string was imported as a key no request can match.
        if not is_key_hash(key.key_sha256):
            raise BadKeysFile(f"line {number}: key_sha256 is not a SHA-256 hex digest")
        try:
            # As a key created here: keys of no one would share one nameless user's conversations,
            # usage, requests to cancel and limits; a name past MAX_USER_BYTES was served unmetered
            # on DynamoDB (each of its usage rows refused) and kept no history.
            # Format characters taken (checked_user's `format_ok`): another system's users.
            checked_user(key.user, format_ok=True)
        except InvalidUser as exc:
            raise BadKeysFile(f"line {number}: {exc}") from None
        if tiers is not None and key.tier not in tiers:
            raise BadKeysFile(f"line {number}: {UnknownTier(key.tier, tiers)}")
        # One key twice: taken once. Given to another user or tier it was imported as the first
        # line said and the other counted "already in the store": which user it bills was unsaid.
        digest = key.key_sha256.lower()
        first = seen.get(digest)
        if first is None:
            seen[digest] = (number, key)
            found.append(key)
        elif (first[1].user, first[1].tier) != (key.user, key.tier):
            raise BadKeysFile(f"line {number}: key_sha256 is line {first[0]}'s, with another user or tier")
    return found


async def import_keys(store: KeyStore, keys: list[LegacyKey]) -> Imported:
    """Not announced to the edges: KeyLifecycle.import_keys is what the CLI and the edges call."""
    new: list[str] = []
    for k in keys:
        digest = k.key_sha256.lower()
        if await _add(store, k, digest):
            new.append(digest)
    return Imported(tuple(new), len(keys) - len(new))


async def _add(store: KeyStore, key: LegacyKey, digest: str) -> bool:
    """False: the key is stored already. Its id may be another key's (48 bits of the hash, as every
    id): the key, whose hash is given, then takes more of its hash as its id. Before, SQLite
    dropped it, counted as 'already in the store', and DynamoDB stored it beside the other."""
    for chars in range(ID_CHARS, len(digest) + 1, 4):
        record = KeyRecord(key_id(digest, chars), digest, key.user, key.tier, created=key.created)
        if await store.add(record):
            return True
        if await store.get(digest) is not None:
            return False
    raise KeyIdTaken(f"the key store refused the key {key_id(digest)} under every id")


def read_keys_file(keys_file: str, tiers: Collection[str]) -> list[LegacyKey]:
    """`[server] keys_file`'s keys; none where it is not set or not there. BadKeysFile for a line
    that is no key, or whose tier is not among the settings' `tiers` (`floodgate serve` reads it
    first, to say so before anything starts): such a key imported without a word, and every
    request of it was then a 403 unknown_tier, as `keys import` refuses it for."""
    path = Path(keys_file) if keys_file else None
    if path is None or not path.is_file():
        return []
    return parse_jsonl(path.read_bytes().splitlines(), tiers)


async def import_keys_file_into(store: KeyStore, keys_file: str, tiers: Collection[str]) -> Imported:
    """`[server] keys_file`, when it exists (today's JSONL, written from the Secrets Manager secret
    at task start): imported at every start and by every key command, insert-only."""
    return await import_keys(store, read_keys_file(keys_file, tiers))
