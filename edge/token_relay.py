"""A replica's token ids relayed as text to one stream: charged, detokenized, stop-matched, written.

Each token used to resume the stream's task: the upstream set a future, the loop stepped the task,
which resumed the upstream's async generator and the relay's `async for`: a future, a scheduled
callback and three frames per token before any of the work (docs/bench-streams.md, fourth pass). An
upstream that offers `generate_direct` (edge/upstreams/direct.py) hands a delta to `offer` right in
its own callback instead, where one engine step (one timer) serves every stream it feeds: when
nothing would make the token wait (the lease grants it locally, the chunk goes straight to the
transport) it is relayed there and the stream's task sleeps on. Anything else goes through the
task as before (`run`), which awaits what must be awaited: the lease's store call, a slow reader's
send (flow control and the stalled-reader watch), the first token (TTFT, keep-alives), the last
delta, and a stop string found, whose end of stream the task must act on (stop strings themselves
are matched in `offer` too: a reply that has them would otherwise wake its task every token).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from edge.text.detokenizer import Detokenizer
from edge.text.stops import StopMatcher
from edge.upstreams.base import Delta, UpstreamError
from limiter.base import OutputLease

TOKENS_LIMIT_MARKER: dict[str, Any] = {"limit_reached": "tokens"}

# Read per token in `offer`: a module constant, not a module's attribute looked up each time.
_clock = time.perf_counter

# Returns what to await for the text to be written, or None when nothing needs awaiting: a plain
# function rather than a coroutine, so a token does not cost one more coroutine frame.
TextSink = Callable[[str], Awaitable[None] | None]


class TokenRelay:
    """One attempt's relay: `run` over the upstream's deltas, `offer` for deltas handed over directly.

    `out` is the generation's Outcome (edge/generation.py: reason, marker, completion_tokens, ttft_s,
    cached_tokens, held, unwritten).
    """

    __slots__ = (
        "_arrived",
        "_consumed",
        "_detok",
        "_grow",
        "_last",
        "_lease",
        "_observe_gap",
        "_on_first",
        "_on_text",
        "_out",
        "_pending",
        "_short",
        "_stop_text",
        "_stopped",
        "_stops",
        "_try_take",
        "_watch_stops",
        "_writing",
    )

    def __init__(
        self,
        out: Any,
        on_text: TextSink,
        detok: Detokenizer,
        stops: StopMatcher,
        lease: OutputLease,
        grow: Callable[[int], None] | None,
        arrived: float,
        on_first: Callable[[], Awaitable[None]],
        observe_gap: Callable[[float], None],
    ) -> None:
        """`observe_gap`: the stream's model's inter-token series (metrics.INTER_TOKEN's child)."""
        self._out = out
        self._observe_gap = observe_gap
        self._on_text = on_text
        self._detok = detok
        self._stops = stops
        self._watch_stops = stops.active
        self._lease = lease
        self._try_take = lease.try_take
        # Real-use KV accounting charges the replica for the tokens as they come (admission/slot.py).
        self._grow = grow
        self._arrived = arrived
        self._on_first = on_first
        self._last = 0.0
        # The tokens try_take granted `offer` of a delta it then left to `run` (the budget's end):
        # charged, not yet counted.
        self._short: list[int] | None = None
        # A delta `offer` relayed whose write must still be awaited (`run` awaits it first).
        self._consumed: Delta | None = None
        self._pending: Awaitable[None] | None = None
        # The text before the stop string `offer` found in the delta it consumed: `run` writes it
        # and ends the reply.
        self._stop_text: str | None = None
        # A stop string ended the reply (its text may still be being written): nothing after it.
        self._stopped = False
        # The text of a write counted and charged but not yet done: left to await (`_pending`), or
        # awaited by the task. uvicorn's send writes nothing until a paused transport drains, so a
        # write cut meanwhile has written nothing.
        self._writing: str | None = None

    def offer(self, delta: Delta) -> bool:
        """Relay `delta` now if nothing would make it wait: True when it is done with (the caller
        must not deliver it again); False when the stream's task must be woken with it, untouched
        or with its write left to await."""
        ids = delta.token_ids
        out = self._out
        if (
            delta.finish_reason is not None
            or not ids
            or out.ttft_s is None
            or self._stop_text is not None
            or self._pending is not None
            or self._short is not None
        ):
            return False
        n = len(ids)
        if n > 1 and self._watch_stops:
            return False  # the task takes it a token at a time (`_one_token_each`)
        granted = self._try_take(n)
        if granted is None:
            return False
        if granted < n:
            self._short = ids[:granted]  # charged: `run` ends the reply with the marker
            return False
        now = _clock()
        self._observe_gap(now - self._last)
        self._last = now
        out.completion_tokens += n
        if self._grow is not None:
            self._grow(out.completion_tokens)
        text = self._detok.push(ids)
        if text and self._watch_stops:
            text, stopped = self._stops.feed(text, out.completion_tokens)
            if stopped:
                self._consumed, self._stop_text = delta, text
                return False
        if text and (written := self._on_text(text)) is not None:
            # A paused or gone reader: the send decides.
            self._consumed, self._pending, self._writing = delta, written, text
            return False
        return True

    async def run(self, deltas: AsyncIterator[Delta]) -> None:
        ended = False
        try:
            await self._run(deltas)
            ended = True
        finally:
            pending, self._pending = self._pending, None
            if isinstance(pending, Coroutine):
                pending.close()  # cut before its turn (a cancel): never started, nothing to undo
            if not ended:
                self._hand_over()

    def _hand_over(self) -> None:
        """What the relay counted or charged and had not written when the stream was cut (a cancel,
        the drain's deadline, its key's end, a disconnect, a stalled reader) or failed: the reply
        it still gets holds it, in its closing events (edge/generation.py), as it holds what it
        was charged for. A write cut before it was done (its text kept, `out.unwritten`); the text
        before a stop string `offer` found; the tokens of the short grant `offer` charged at the
        budget's end; and what the detokenizer and the stop matcher held back (a character's first
        bytes, a possible stop string's start), flushed as a reply's end flushes them
        (`tail_text`). So a cut reply may end with the start of a stop string (`</ans`), which no
        reply that ran to its end shows: its tokens were counted and charged, and the text sent
        is the text usage counts (tests/edge/test_relay_interleavings.py holds both to that)."""
        out = self._out
        writing, self._writing = self._writing, None
        if writing is not None:
            out.unwritten += writing
        stop_text, self._stop_text = self._stop_text, None
        if stop_text is not None or self._stopped:
            if stop_text:
                out.held.append(stop_text)
            return  # the reply ended at its stop string: nothing after it
        text = ""
        short, self._short = self._short, None
        if short:
            out.completion_tokens += len(short)
            if self._grow is not None:
                self._grow(out.completion_tokens)
            text = self._detok.push(short)
        text = tail_text(text + self._detok.flush(), self._stops, out.completion_tokens)
        if text:
            out.held.append(text)

    async def _write(self, written: Awaitable[None], text: str) -> None:
        """Await a write the sink left pending, its text known until it is done (`_hand_over`)."""
        self._writing = text
        await written
        self._writing = None

    async def _one_token_each(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        """A delta of several tokens (a reader that lagged a step, whose outputs the replica
        merged) one token at a time, when a stop string may end the reply inside it: the tokens
        after the one that completes the match are neither counted nor charged, as vLLM stops at
        that token. Matched on the whole delta, they were: the same reply's completion_tokens (and
        its charge) then depended on when its reader had last caught up."""
        async for delta in deltas:
            ids = delta.token_ids
            if len(ids) <= 1 or delta is self._consumed:
                yield delta
                continue
            last = len(ids) - 1
            for i, token in enumerate(ids):
                finish = delta.finish_reason if i == last else None
                yield Delta([token], finish, delta.cached_tokens if i == 0 else 0)

    async def _run(self, deltas: AsyncIterator[Delta]) -> None:
        if self._watch_stops:
            deltas = self._one_token_each(deltas)
        out = self._out
        detok = self._detok
        stops = self._stops
        lease = self._lease
        try_take = self._try_take
        watch_stops = self._watch_stops
        grow = self._grow
        on_text = self._on_text
        # A delta that ends the reply (its finish reason, or the budget's end) is held, not written:
        # the caller writes it with the closing events, which are ready at the same moment.
        hold: TextSink = out.held.append
        async for delta in deltas:
            if self._pending is not None:
                pending, self._pending = self._pending, None
                await pending
                self._writing = None
            if delta is self._consumed:
                self._consumed = None
                if self._stop_text is not None:
                    text, self._stop_text = self._stop_text, None
                    self._stopped = True
                    if text and (written := on_text(text)) is not None:
                        await self._write(written, text)
                    out.reason = "stop"
                    return
                continue
            ids = delta.token_ids
            finish = delta.finish_reason
            sink = on_text if finish is None or finish in ("error", "cancelled") else hold
            if ids:
                n = len(ids)
                now = _clock()
                if out.ttft_s is None:
                    out.ttft_s = now - self._arrived
                    # Reported on the delta carrying the first token (gpu_container/contract.py).
                    out.cached_tokens = delta.cached_tokens
                    await self._on_first()
                else:
                    self._observe_gap(now - self._last)
                self._last = now
                short, self._short = self._short, None
                granted = try_take(n) if short is None else len(short)
                if granted is None:
                    granted = await lease.take(n)
                if granted < n:
                    ids = ids[:granted]
                    sink = hold
                out.completion_tokens += granted
                if grow is not None:
                    grow(out.completion_tokens)
                text = detok.push(ids) if granted else ""
                if text:
                    stopped = False
                    if watch_stops:
                        text, stopped = stops.feed(text, out.completion_tokens)
                        self._stopped = stopped
                    if text and (written := sink(text)) is not None:
                        await self._write(written, text)
                    if stopped:
                        out.reason = "stop"
                        return
                if granted < n:
                    await emit_tail(detok.flush(), stops, hold, out.completion_tokens)
                    out.reason = "length"
                    out.marker = TOKENS_LIMIT_MARKER
                    return
            if finish is not None:
                if finish in ("error", "cancelled"):
                    raise UpstreamError(f"replica ended the sequence with {finish!r}")
                await emit_tail(detok.flush(), stops, hold, out.completion_tokens)
                out.reason = finish
                return
        raise UpstreamError("replica stream ended without a finish reason")


def tail_text(text: str, stops: StopMatcher, tokens: int) -> str:
    """A reply's last text through the stop matcher: up to a stop string it completes, else with
    what the matcher held back as a possible one's start."""
    text, stopped = stops.feed(text, tokens)
    return text if stopped else text + stops.flush()


async def emit_tail(text: str, stops: StopMatcher, on_text: TextSink, tokens: int) -> None:
    text = tail_text(text, stops, tokens)
    if text and (written := on_text(text)) is not None:
        await written
