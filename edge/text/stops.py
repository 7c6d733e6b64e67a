"""Stop strings matched across deltas: text that might be the start of a stop string is held back."""

from __future__ import annotations


class StopMatcher:
    """`feed` returns (text safe to emit, stopped). The stop string itself is never emitted."""

    __slots__ = ("_held", "_longest", "_stops")

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = self._partial_suffix_len(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held text once the sequence ended without completing a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix_len(self, buf: str) -> int:
        # The longest tail of buf that is a proper prefix of some stop string.
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0
