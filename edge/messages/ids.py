"""Time-ordered message ids: sorting them as strings sorts messages by creation time."""

from __future__ import annotations

import secrets
import threading
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_CROCKFORD[digit])
    return "".join(reversed(chars))


class MessageIdGenerator:
    """ULID-shaped ids (48-bit millisecond time + 80 random bits, 26 Crockford base-32 characters).

    Within one millisecond the random part is incremented instead of redrawn, so a user message and
    the reply written right after it never sort out of order in the same process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_random = 0

    def new_id(self, now_ms: int | None = None) -> str:
        with self._lock:
            ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
            if ms <= self._last_ms and self._last_random < _RANDOM_MAX:
                ms = self._last_ms
                rand = self._last_random + 1
            else:
                rand = secrets.randbits(_RANDOM_BITS)
            self._last_ms, self._last_random = ms, rand
        return _encode(ms, 10) + _encode(rand, 16)


_generator = MessageIdGenerator()


def new_message_id() -> str:
    return _generator.new_id()
