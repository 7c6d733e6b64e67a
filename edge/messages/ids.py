"""Time-ordered message ids: sorting them as strings sorts messages by creation time."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_CROCKFORD[digit])
    return "".join(reversed(chars))


def _decode(message_id: str) -> tuple[int, int]:
    """An id's millisecond and random part."""
    value = 0
    for char in message_id:
        value = value * 32 + _CROCKFORD.index(char)
    return value >> _RANDOM_BITS, value & _RANDOM_MAX


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _above(message_id: str) -> str:
    """An id just above `message_id`: its millisecond, a random part drawn above its own (the next
    millisecond where it has none above), so that it sorts right after it and is as unlikely as a
    fresh id to be one another edge makes."""
    ms, rand = _decode(message_id)
    if rand == _RANDOM_MAX:
        return _encode(ms + 1, 10) + _encode(secrets.randbits(_RANDOM_BITS), 16)
    return _encode(ms, 10) + _encode(rand + 1 + secrets.randbelow(_RANDOM_MAX - rand), 16)


class MessageIdGenerator:
    """ULID-shaped ids (48-bit millisecond time + 80 random bits, 26 Crockford base-32 characters).

    Within one millisecond the random part is incremented instead of redrawn, so a user message and
    the reply written right after it never sort out of order in the same process.
    """

    def __init__(self, clock_ms: Callable[[], int] = _now_ms) -> None:
        # The edge's clock (Unix milliseconds): each edge of a fleet reads its own.
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_random = 0

    def new_id(self, now_ms: int | None = None, *, after: str | None = None) -> str:
        """A new id, greater than `after` too (a conversation's newest id, as its lock gave it:
        ConversationLocks): its turns are made on whichever edge serves each, and an edge whose
        clock runs behind the last one's made ids that sorted before the turns it answered."""
        with self._lock:
            ms = self._clock_ms() if now_ms is None else now_ms
            if ms <= self._last_ms and self._last_random < _RANDOM_MAX:
                ms = self._last_ms
                rand = self._last_random + 1
            else:
                rand = secrets.randbits(_RANDOM_BITS)
            self._last_ms, self._last_random = ms, rand
        made = _encode(ms, 10) + _encode(rand, 16)
        return _above(after) if after is not None and made <= after else made


_generator = MessageIdGenerator()


def new_message_id() -> str:
    return _generator.new_id()
