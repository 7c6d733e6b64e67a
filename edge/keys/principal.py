"""Who a request is from, once its key checked out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tier: str
    key_id: str = ""
