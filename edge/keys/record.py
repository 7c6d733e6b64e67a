"""One API key as the stores keep it, and the one-way functions around it."""

from __future__ import annotations

import hashlib
import secrets
import time
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass, replace
from string import hexdigits

KEY_PREFIX = "fg-"
ADMIN_KEY_PREFIX = "fgadmin-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def is_key_hash(text: str) -> bool:
    """Whether `text` could be a hash_key(): 64 hex digits (any other string matches no key)."""
    return len(text) == 64 and set(text.lower()) <= set(hexdigits)


# The longest user name, in UTF-8 bytes. DynamoDB keys a user's usage rows by `usage#<user>` and
# their conversations by `<len>/<user>/<conversation id>` (up to 1,024 bytes), in a partition key of
# at most 2,048 bytes: a longer name was taken, and then every usage row and message of that user
# was refused (a ValidationException: their GET /v1/usage a 503 for good, their history never kept).
MAX_USER_BYTES = 512


class InvalidUser(ValueError):
    """A key's user must name someone: an empty name (or one of spaces only) would pool every such
    key's limits and usage under one nameless user. And fit the stores' keys (MAX_USER_BYTES)."""

    def __init__(self, message: str = "user must not be empty") -> None:
        super().__init__(message)


# What no name or note is made of, and what a terminal acts on: C0/C1 controls (a newline, a
# carriage return, ESC starting a sequence that recolours, clears or retitles the terminal) and the
# Unicode line and paragraph separators. And the invisible format characters (Cf: bidi overrides
# and isolates, zero-width spaces and joiners, a BOM): "ci-\u202eyek" is shown as "ci-key", and
# "alice\u200b" as alice, so a label or user read as another key's in `keys list` and in the admin
# API's answers. Refused rather than shown escaped: an operator's note or a user's id has no need
# of them (the cost is a ZWJ emoji or a Persian ZWNJ in a label), and a refusal protects every
# reader of the admin API, where escaping would protect only the CLI's table.
_CONTROL_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cf"})
# The controls alone: what no user id is made of, even one another system gave (checked_user's
# `format_ok`).
_CONTROLS_ONLY = frozenset({"Cc", "Zl", "Zp"})


def has_control_character(text: str) -> bool:
    return first_control_character(text) is not None


def first_control_character(text: str, categories: frozenset[str] = _CONTROL_CATEGORIES) -> str | None:
    return next((c for c in text if unicodedata.category(c) in categories), None)


def _refusal(field: str, found: str) -> str:
    """Names the character: a format one is invisible, so the operator could not see what was wrong."""
    return (
        f"{field} must not contain control characters (newlines, escapes) or invisible format "
        f"characters (bidi overrides, zero-width ones): U+{ord(found):04X}"
    )


def printable(text: str) -> str:
    """`text` with its control and format characters escaped (`\\n`, `\\x1b`, `\\u2028`,
    `\\u202e`), the rest as it is: for a table an operator reads in a terminal (a stored user or
    label from before they were refused)."""
    if not has_control_character(text):
        return text
    return "".join(
        c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in _CONTROL_CATEGORIES else c
        for c in text
    )


def checked_user(user: str, *, format_ok: bool = False) -> str:
    """`user`, if a key may be given it: the one check every way of naming a key's user goes
    through (create, the keys file's import; rotate keeps the old key's).

    `format_ok`: the keys file's users (legacy.py) may have format characters. They are another
    system's ids, in use already (their usage, limits and conversations keyed by them), listed
    escaped as a user stored before the refusal is: refused, one such line (a Persian name's
    zero-width non-joiner) ended every key command and every edge start in BadKeysFile, an
    upgrade taking the whole edge down. Controls are refused there too, as they always were."""
    if not user.strip():
        raise InvalidUser()
    categories = _CONTROLS_ONLY if format_ok else _CONTROL_CATEGORIES
    if (found := first_control_character(user, categories)) is not None:
        # `floodgate keys list` and `floodgate usage` print it in a table: a newline drew a row of
        # the sender's choosing, an escape sequence reached the operator's terminal.
        raise InvalidUser(_refusal("user", found))
    if len(user.encode()) > MAX_USER_BYTES:
        raise InvalidUser(f"user must be at most {MAX_USER_BYTES} bytes (UTF-8), not {len(user.encode())}")
    return user


# The longest label (a note for the operator), in UTF-8 bytes. It had no bound: on DynamoDB one past
# an item's 400 KB was refused (a ValidationException, answered as a store to retry, for good), and
# on SQLite it was kept and sent in every listing.
MAX_LABEL_BYTES = 1024


class InvalidLabel(ValueError):
    """A label past MAX_LABEL_BYTES, or with a character checked_label refuses: the message says which."""


def checked_label(label: str) -> str:
    """`label`, if a key may be given it (create; rotate keeps the old key's). Without control
    characters: `floodgate keys list` prints it in a table, where a newline drew a row of the
    sender's choosing (a key that does not exist, another user's tier) and an escape sequence
    reached the operator's terminal."""
    if (size := len(label.encode())) > MAX_LABEL_BYTES:
        raise InvalidLabel(f"label must be at most {MAX_LABEL_BYTES} bytes (UTF-8), not {size}")
    if (found := first_control_character(label)) is not None:
        raise InvalidLabel(_refusal("label", found))
    return label


class UnknownTier(ValueError):
    def __init__(self, tier: str, tiers: Collection[str]) -> None:
        super().__init__(f"unknown tier {tier!r}; configured: {', '.join(sorted(tiers))}")


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
    # The id of the key this one was made by a rotation to replace, set once, when it is made: a
    # revocation of this key ends that one's grace (KeyLifecycle.revoke) without scanning for it.
    # Only where that key's `replaced_by` names this one (a rotation that lost its race revokes
    # its new key, which still names the key it meant to replace).
    replaces: str | None = None

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
