"""One page of a key listing, as OpenAI's list endpoints page: keys in id order after a cursor.

Id order, not creation order: an id is a key of both stores (SQLite's UNIQUE index, DynamoDB's
index sort key), so the next page starts where the last id left off, however many keys there are,
and a key created meanwhile is on the page its id falls in, never shown twice."""

from __future__ import annotations

import re
from dataclasses import dataclass

from edge.keys.record import KeyRecord

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# What record.key_id makes: `key_` and 12 hex digits of the hash, up to all 64 for an imported key
# whose first ones another key's id holds.
KEY_ID = re.compile(r"key_[0-9a-f]{12,64}")


@dataclass(frozen=True, slots=True)
class KeyPage:
    keys: list[KeyRecord]
    # More keys follow the last of these (ask again with after=its id).
    has_more: bool


def page_of(found: list[KeyRecord], limit: int) -> KeyPage:
    """`found` is up to limit + 1 keys in id order: the one past the page says there are more, for
    no second read."""
    return KeyPage(found[:limit], len(found) > limit)
