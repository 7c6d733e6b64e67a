"""One page of usage rows, as OpenAI's list endpoints page, and the ids its cursor is made of.

A row is one (user, day, model): its id says just that (base64url of the three, so any user name
or model fits), and `after` is the id of the last row of the page before. The store starts past
that row with no offset read through: SQLite's primary key, DynamoDB's table key (its
ExclusiveStartKey is the row's own key)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from edge.usage.record import Usage

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
PREFIX = "usage_"
# The longest id a row can have: a user of 512 bytes and a model name well past any served.
MAX_ID_CHARS = 4096

Position = tuple[str, str, str]  # user, day, model


class BadCursor(ValueError):
    """A cursor that names no row the store could hold (a row id made up, not one it listed): the
    client's mistake, a 400, not the store's trouble."""


@dataclass(frozen=True, slots=True)
class UsagePage:
    rows: list[Usage]
    has_more: bool  # more rows follow the last of these (ask again with after=its id)


def row_id(row: Usage) -> str:
    raw = json.dumps([row.user, row.day, row.model], ensure_ascii=False, separators=(",", ":"))
    return PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def position(cursor: str) -> Position:
    """The (user, day, model) a row id names; ValueError for anything else."""
    if not cursor.startswith(PREFIX) or len(cursor) > MAX_ID_CHARS:
        raise ValueError("not a usage row id")
    body = cursor[len(PREFIX) :]
    try:
        parts = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a usage row id") from None
    if not (isinstance(parts, list) and len(parts) == 3 and all(isinstance(p, str) for p in parts)):
        raise ValueError("not a usage row id")
    if not all(_utf8(p) for p in parts):
        # JSON spells a lone surrogate ("\ud800"), which no stored user, day or model is: sent on,
        # the store's encoding of it raised (a 500 for any key holder's GET /v1/usage).
        raise ValueError("not a usage row id")
    return parts[0], parts[1], parts[2]


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def page_of(found: list[Usage], limit: int) -> UsagePage:
    """`found` is up to limit + 1 rows: the one past the page says there are more."""
    return UsagePage(found[:limit], len(found) > limit)
