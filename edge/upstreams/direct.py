"""An upstream's optional second way to stream: each delta handed to the edge in the upstream's own
callback, without waking the stream's task.

A real engine's step emits a token for every running sequence at once. Through `generate` alone,
each of those tokens sets a future, and the loop then steps each stream's task and resumes its
async generators: per token, a wake-up and a dozen Python frames. An upstream that also offers
`generate_direct(req, offer)` calls `offer(delta)` where it has the delta (one engine step, one
loop callback, every stream it feeds); True means the edge relayed it already, so the upstream
keeps the stream's task asleep and goes on; False means the upstream delivers that same delta
through the returned iterator as `generate` would (the edge had to wait for something: the lease's
store, a slow reader, the end of the reply). The iterator stays the stream's lifeline: closing it
aborts the sequence, and a cancelled task stops being offered anything (its future is done).

A delta is offered only while the stream's task waits on the iterator for its next one, never
while it is busy with one (awaiting the lease's store for it, or a write): the relay would write
the later delta's text first, and charge it to the lease the task is extending (the in-process
engine's Mailbox and the Triton connection's `_reader_waits` both hold to this).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from edge.upstreams.base import Delta, GenerationRequest

DeltaSink = Callable[[Delta], bool]
GenerateDirect = Callable[[GenerationRequest, DeltaSink], AsyncIterator[Delta]]
