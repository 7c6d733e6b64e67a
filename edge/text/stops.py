"""Stop strings matched across deltas: text that might be the start of a stop string is held back.

A stop string ends the reply only once the reply has `min_tokens` tokens, as vLLM's min_tokens holds
back every way a reply ends: its stop checker looks for stop strings only from the token that reaches
it on, each time in the text that token brought (one that began earlier, held here as a possible
stop, counts). One that ended sooner is sent as text. The count is the relay's after each delta, so
on a delta of several tokens (the engine's mailbox merges what a slow reader has not taken) the
whole delta is judged by its last token's count.
"""

from __future__ import annotations


class StopMatcher:
    """`feed` returns (text safe to emit, stopped). The stop string itself is never emitted."""

    __slots__ = ("_held", "_longest", "_min_tokens", "_stops")

    def __init__(self, stops: list[str], min_tokens: int = 0) -> None:
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._min_tokens = min_tokens
        self._held = ""

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def feed(self, text: str, tokens: int = 0) -> tuple[str, bool]:
        """`tokens`: how many the reply has with this text's."""
        if not self._stops:
            return text, False
        buf = self._held + text
        if tokens >= self._min_tokens:
            # The held text is only ever a proper prefix of a stop string: a match ends in `text`.
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
