"""API keys: Bearer key → (user, tier). Only SHA-256 hashes are stored, one JSON object per line.

The keys file is re-read when it changes, so `floodgate keys create` works on a running server.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from edge.errors import ApiError

KEY_PREFIX = "fg-"


class KeyRecord(msgspec.Struct):
    key_sha256: str
    user: str
    tier: str
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tier: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(keys_file: Path, user: str, tier: str) -> str:
    """Append a new key for (user, tier) and return it: the only time it exists in clear."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = KeyRecord(key_sha256=hash_key(key), user=user, tier=tier, created=time.time())
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(keys_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
        out.write(msgspec.json.encode(record) + b"\n")
    return key


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key")


class KeyStore:
    def __init__(self, keys_file: Path) -> None:
        self._path = keys_file
        self._stamp: tuple[int, int] | None = None
        self._by_hash: dict[str, KeyRecord] = {}

    def has_keys(self) -> bool:
        self._refresh()
        return bool(self._by_hash)

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise unauthorized("Malformed Authorization header; expected 'Bearer <key>'.")
        self._refresh()
        digest = hash_key(key.strip())
        # The lookup works on the hash, which an attacker cannot steer byte by byte; the final
        # comparison is constant-time all the same.
        record = self._by_hash.get(digest)
        if record is None or not hmac.compare_digest(record.key_sha256, digest):
            raise unauthorized("Incorrect API key provided.")
        return Principal(user=record.user, tier=record.tier)

    def _refresh(self) -> None:
        try:
            st = self._path.stat()
        except FileNotFoundError:
            self._stamp, self._by_hash = None, {}
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        decoder = msgspec.json.Decoder(KeyRecord)
        records = [decoder.decode(line) for line in self._path.read_bytes().splitlines() if line.strip()]
        self._by_hash = {r.key_sha256: r for r in records}
        self._stamp = stamp
