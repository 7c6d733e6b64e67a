"""Concurrent calls of one script, sent together: one pipelined round trip for all that waited.

Most of a decision's cost is the client's per-call path (redis-py asyncio: connection checkout,
command packing, a read wake-up), not Redis. While one batch is on the wire, the callers that
arrive meanwhile queue here and go as the next batch, so under load each call costs a fraction of
a round trip; a lone caller waits for no one (its batch leaves at once). Each call is still its
own atomic script run on Redis.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_BATCH = 128
# Batches on the wire at once: while one is on Redis, the next is packed and sent, so the client's
# CPU and Redis's overlap instead of taking turns.
DEFAULT_MAX_IN_FLIGHT = 4

Keys = Sequence[str]
Args = Sequence[str | int]


@dataclass(slots=True)
class _Call:
    keys: Keys
    args: Args
    epoch: int
    answer: asyncio.Future[Any]


SendBatch = Callable[[list[tuple[Keys, Args]], int], Awaitable[list[Any]]]


class CallBatcher:
    def __init__(
        self,
        send: SendBatch,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        """`send(calls, epoch)` sends calls in one round trip and returns their replies in order,
        or raises (every call of the batch then raises the same)."""
        self._send = send
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._pending: list[_Call] = []
        self._writers: set[asyncio.Task[None]] = set()

    async def call(self, keys: Keys, args: Args, epoch: int) -> Any:
        """`epoch`: calls of different epochs never share a batch (see RedisLimiter._call)."""
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Call(keys, args, epoch, answer))
        if len(self._writers) < self._max_in_flight:
            # A context of its own: it serves every caller, not the one whose request started it,
            # and its log lines must not carry that request's id.
            writer = asyncio.create_task(self._write(), name="limiter-batch", context=contextvars.Context())
            self._writers.add(writer)
            # (A writer removes itself when it ends; this covers one ending by an error.)
            writer.add_done_callback(self._writers.discard)
        return await answer

    async def _write(self) -> None:
        try:
            while self._pending:
                epoch = self._pending[0].epoch
                batch = [c for c in self._pending[: self._max_batch] if c.epoch == epoch]
                taken = {id(c) for c in batch}
                self._pending = [c for c in self._pending if id(c) not in taken]
                batch = [c for c in batch if not c.answer.done()]  # a cancelled caller's call
                if not batch:
                    continue
                try:
                    replies = await self._send([(c.keys, c.args) for c in batch], epoch)
                except BaseException as exc:
                    for c in batch:
                        if not c.answer.done():
                            c.answer.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for c, reply in zip(batch, replies, strict=True):
                    if not c.answer.done():
                        c.answer.set_result(reply)
            # Leave the set in the same step as the loop found nothing pending (a done-callback
            # would run later, and a call arriving meanwhile would count this writer as running).
            self._writers.discard(asyncio.current_task())
        except asyncio.CancelledError:
            self._writers.discard(asyncio.current_task())
            for c in self._pending:  # nothing will send them now
                if not c.answer.done():
                    c.answer.cancel()
            self._pending.clear()
            raise

    async def aclose(self) -> None:
        while self._writers:
            # Again if need be: a cancel landing as a store call's own timeout fires is lost
            # (asyncio.timeout in Python 3.11); a writer ends anyway once nothing is pending.
            for writer in self._writers:
                writer.cancel()
            await asyncio.wait(set(self._writers), timeout=1.0)
