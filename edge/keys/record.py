"""One API key as the stores keep it, and the one-way functions around it."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, replace
from string import hexdigits

KEY_PREFIX = "fg-"
ADMIN_KEY_PREFIX = "fgadmin-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def is_key_hash(text: str) -> bool:
    """Whether `text` could be a hash_key(): 64 hex digits (any other string matches no key)."""
    return len(text) == 64 and set(text.lower()) <= set(hexdigits)


ID_CHARS = 12


def key_id(key_sha256: str, chars: int = ID_CHARS) -> str:
    """The public handle of a key (list, revoke, rotate name it): derived from the hash, so importing
    the same key twice makes one record. 48 bits of a SHA-256 say nothing usable about the key.
    Two keys' first 48 bits can agree (about one pair in 2**24 keys): a store refuses the second
    id (KeyStore.add), and an imported key, whose hash is given, then takes more of its hash."""
    return "key_" + key_sha256[:chars]


def new_secret(prefix: str = KEY_PREFIX) -> str:
    return prefix + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    key_sha256: str
    user: str
    tier: str
    label: str = ""
    created: float = 0.0  # Unix seconds
    expires: float | None = None  # Unix seconds; None: never
    revoked: float | None = None  # when it was revoked; None: live
    last4: str = ""  # the key's last four characters ("" for keys imported as hashes)
    # The id of the key a rotation made to replace this one (which then works only for the grace):
    # a key is replaced once, so a second rotate can be refused and name the first one's key.
    replaced_by: str | None = None

    def status(self, now: float) -> str:
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return "active"

    def with_changes(self, **changes: object) -> KeyRecord:
        return replace(self, **changes)  # type: ignore[arg-type]


def new_record(user: str, tier: str, label: str = "", expires: float | None = None) -> tuple[str, KeyRecord]:
    """A fresh key and its record: the only time the key exists in clear."""
    key = new_secret()
    digest = hash_key(key)
    record = KeyRecord(
        id=key_id(digest),
        key_sha256=digest,
        user=user,
        tier=tier,
        label=label,
        created=time.time(),
        expires=expires,
        last4=key[-4:],
    )
    return key, record
