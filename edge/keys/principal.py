"""Who a request is from, once its key checked out."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tier: str
    key_id: str = ""
    # The key's hash and expiry (Unix seconds; None: never), for ending the streams it admitted when
    # it stops being active (edge/keys/stream_watch.py). A hash is no secret; never logged all the same.
    key_sha256: str = field(default="", repr=False)
    expires: float | None = None
