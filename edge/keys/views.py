"""How a key is shown outside the store (CLI and admin API): never the key, never its hash."""

from __future__ import annotations

import time
from typing import Any

from edge.keys.record import KeyRecord


def key_view(record: KeyRecord, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    return {
        "id": record.id,
        "user": record.user,
        "tier": record.tier,
        "label": record.label,
        "last4": record.last4,
        "created": record.created,
        "expires": record.expires,
        "revoked": record.revoked,
        "status": record.status(now),
        "replaced_by": record.replaced_by,
    }
