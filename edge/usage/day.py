"""The days a usage query names: a real calendar date written YYYY-MM-DD, as the rows' own `day`.

Rows are compared with the bounds as strings (edge/usage/sqlite.py, dynamodb.py), so a bound that
is no date ("2026-13-01", "bad") would answer an empty or partial list as if it were one: the HTTP
API answers 400 and the CLI exits 2 instead, naming the bound.
"""

from __future__ import annotations

import datetime
import re

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def checked_day(value: str) -> str:
    """`value` if it is a day, else ValueError saying what a day looks like."""
    try:
        if not _DAY.fullmatch(value):
            raise ValueError
        datetime.date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"must be a date like 2026-01-31, not {value!r}") from None
    return value
