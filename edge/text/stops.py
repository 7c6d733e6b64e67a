"""Stop strings matched across deltas: text that might be the start of a stop string is held back.

A stop string ends the reply only once the reply has `min_tokens` tokens, as vLLM's min_tokens holds
back every way a reply ends: its stop checker looks for stop strings only from the token that reaches
it on, each time in the text that token brought (one that began earlier, held here as a possible
stop, counts). One that ended sooner is sent as text. The count is the relay's after each delta, so
on a delta of several tokens (the engine's mailbox merges what a slow reader has not taken) the
whole delta is judged by its last token's count.

How much to hold back is the longest tail of the text that begins some stop string. Tried tail by
tail with a slice and a `startswith` per string, that took 3.4-6.3 µs a token for one to four short
stop strings, and the square of a long one's length whenever a long held prefix stops matching:
10.7-15.6 ms of the event loop for one token with a 16,000-character stop string (every stream the
loop serves waits as long), where a request chooses its stop strings and, with a seed, the reply
they shadow. Now the short strings' proper prefixes are sets by length, a tail one lookup after a
check of its first character (0.7-1.4 µs a token), and stop strings longer than SHORT_STOP follow
their matched prefix character by character (Knuth-Morris-Pratt, its table built only as far as the
text has matched: linear in the text; 0.37-0.54 ms for that token). `python -m bench.stop_strings`,
three rounds of each side by side.
"""

from __future__ import annotations

# Stop strings up to this long are checked tail by tail: at most SHORT_STOP tails of a token's text.
SHORT_STOP = 32


class _LongStop:
    """How much of one long stop string the text so far ends with (a proper prefix: a whole match is
    found by `str.find`, which also decides where the reply is cut)."""

    __slots__ = ("_border", "matched", "stop", "table")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.matched = 0
        # table[i]: the longest proper prefix of stop[: i + 1] that is also a suffix of it. Built only
        # as far as the text has matched (it depends on no more of the string), so a long stop string
        # the reply never follows costs nothing: a request may send megabytes of them.
        self.table = [0]
        self._border = 0

    def _extend(self, length: int) -> None:
        stop, table, k = self.stop, self.table, self._border
        for i in range(len(table), length):
            while k and stop[i] != stop[k]:
                k = table[k - 1]
            if stop[i] == stop[k]:
                k += 1
            table.append(k)
        self._border = k

    def advance(self, text: str) -> int:
        stop, table, k, whole = self.stop, self.table, self.matched, len(self.stop)
        for char in text:
            while k and stop[k] != char:
                k = table[k - 1]
            if stop[k] == char:
                k += 1
                if k > len(table):
                    self._extend(k)
                if k == whole:  # a whole match (sent as text before min_tokens): go on from its border
                    k = table[k - 1]
        self.matched = k
        return k


class StopMatcher:
    """`feed` returns (text safe to emit, stopped). The stop string itself is not emitted, unless
    `include` (vLLM's include_stop_str_in_output): then the reply is cut after it, not before. Only
    the found stop's end differs, so the text matched per token is the same either way."""

    __slots__ = ("_firsts", "_held", "_include", "_long", "_min_tokens", "_prefixes", "_stops")

    def __init__(self, stops: list[str], min_tokens: int = 0, include: bool = False) -> None:
        self._include = include
        self._stops = [s for s in stops if s]
        short = [s for s in self._stops if len(s) <= SHORT_STOP]
        # The short strings' proper prefixes by length, longest first, and their first characters:
        # a tail is one set lookup, and most tails of prose fail at their first character.
        lengths = range(max((len(s) for s in short), default=1) - 1, 0, -1)
        self._prefixes = [(n, frozenset(s[:n] for s in short if len(s) > n)) for n in lengths]
        self._firsts = frozenset(s[0] for s in short)
        self._long = [_LongStop(s) for s in self._stops if len(s) > SHORT_STOP]
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
            # Only a stop string that ends in `text`: the held text begins one but may hold another
            # whole, one that ended before min_tokens ("ab" held as the start of "abcd").
            held = len(self._held)
            cut = -1  # `end` is set with it: where the stop string found ends
            for stop in self._stops:
                at = buf.find(stop, held - len(stop) + 1 if held >= len(stop) else 0)
                if at >= 0 and (cut < 0 or at < cut):
                    cut, end = at, at + len(stop)
            if cut >= 0:
                self._held = ""
                return buf[: end if self._include else cut], True
        keep = self._partial_suffix_len(buf)
        for long in self._long:
            keep = max(keep, long.advance(text))
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held text once the sequence ended without completing a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix_len(self, buf: str) -> int:
        # The longest tail of buf that is a proper prefix of some short stop string.
        firsts, size = self._firsts, len(buf)
        for n, prefixes in self._prefixes:
            if n <= size and buf[size - n] in firsts and buf[size - n :] in prefixes:
                return n
        return 0
