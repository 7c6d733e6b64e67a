"""Usage recording off the token path: `record` only adds the request's counts to the row of its
(user, model, day) waiting to be written; one task takes the waiting rows and adds them to the store.

Rows wait summed, not one per request: while the store is down the writer retries its batch, and
every request ending meanwhile waits. Each waited on its own, so an outage past `queue_size`
requests (10,000: under a minute of an edge ending a few hundred a second) dropped every request
after, though the limiter had charged it; `queue_size` now bounds the distinct rows waiting (users
with usage that day, per model), and a request of a row already waiting always joins it.

The task gathers for `gather_s` (0.25 s) after the first row of a batch before it writes: woken
for each few requests, its wake-ups and the store's thread hand-off and SQLite write were 5-11 %
of a one-token stream's set-up CPU (docs/bench-streams.md, sixth pass); gathering makes them a
few per second whatever the request rate, and a row reaches the store a quarter second later.

A usage read on this edge (GET /v1/usage, /v1/admin/usage) first has what this edge queued for its
user (everyone, for the admin's read) written (`written`): the gather is cut short and the read waits
for that batch, at most `[keys] usage_read_wait_s`, so a client reading its usage when its request
ends finds it there, as a conversation's history is (edge/messages/writer.py). The request path
pays nothing for it: `record` is as it was; the read looks up its user's waiting rows itself.
Another edge's queue it cannot see, nor another worker's of `serve --workers` (a process each, whose
kernel-spread connections may put a client's next request on a sibling): a request a sibling ended
within its `gather_s` may be missing from this read. Exact across processes would take a flush
asked of every one (over Redis, for a fleet's); the usage API, OpenAI's included, is read as a
record of the past, not of the last moment.

A clean shutdown writes everything queued (retrying while the store fails) before the app exits.
Only if the store stays down past `drain_timeout_s` does `aclose` give up, and then every row it
could not write is logged whole (`usage_unwritten`: user, model, day, tokens), so billing can
replay it from the log. The row whose write was under way may have landed: it is logged on its
own with its WriteId (`writer`, `seq`, `maybe_written`), which a replay through the store's `add`
applies at most once (on SQLite, within the 30 days it keeps a writer's seq: edge/usage/sqlite.py).
A request recorded after `aclose` began, or of a new row while `queue_size` rows wait, is dropped
the same way: counted and logged whole (`usage_dropped`).

A row the store refuses itself (UsageRefused: no retry could write it) is logged the same way,
`usage_unwritten` with `refused`, and the rows behind it go on.

Every retry of a row carries the row's WriteId (edge/usage/store.py), so a write that landed with
its answer lost is not added twice. A batch's rows (one per user, model and day) go
`store.parallel_writes` at a time, and a batch only after the one before has landed: a row's seqs
rise in store order wherever the store keeps them.

`drain_timeout_s` fits the exit: a deployment leaves the edge 5 s between the drain deadline and
SIGKILL (docs/deploy.md, Graceful drain), and rows still unwritten when it is killed are in no log
at all."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import secrets
from collections import defaultdict

import structlog

from edge.task_stop import stop_task
from edge.usage.metrics import (
    USAGE_DROPPED,
    USAGE_READS_UNWRITTEN,
    USAGE_ROWS_WRITTEN,
    USAGE_WRITE_RETRIES,
    USAGE_WRITES_REPEATED,
)
from edge.usage.record import Usage, utc_day
from edge.usage.store import UsageRefused, UsageStore, WriteId

log = structlog.get_logger("floodgate.usage")

Key = tuple[str, str, str]  # user, model, day


class UsageWriter:
    def __init__(
        self,
        store: UsageStore,
        queue_size: int,
        *,
        base_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        drain_timeout_s: float = 1.5,
        gather_s: float = 0.25,
    ) -> None:
        self._store = store
        # Rows waiting for the worker, summed per key: [input_tokens, output_tokens, requests,
        # input_cached_tokens] (Usage's field order, after its key).
        self._waiting: dict[Key, list[int]] = {}
        self._max_waiting = queue_size
        self._wake = asyncio.Event()  # a row is waiting
        self._idle = asyncio.Event()  # nothing waiting and no batch under way
        self._idle.set()
        self._base_backoff_s = base_backoff_s
        self._max_backoff_s = max_backoff_s
        self._drain_timeout_s = drain_timeout_s
        self._gather_s = gather_s
        # Set by aclose, or by a usage read waiting for rows that gather: the batch being gathered
        # (or the next) is written at once, not a gather later.
        self._write_now = asyncio.Event()
        # Batches taken from `_waiting` so far, and written (or given up on) so far: the rows
        # waiting go out in batch `_taken + 1`, those of `_batch` are batch `_taken`.
        self._taken = 0
        self._done = 0
        # A future per batch some read waits for, resolved when that batch is done with.
        self._landed: dict[int, asyncio.Future[None]] = {}
        self._batch: list[Usage] = []
        # The rows being written, by their WriteId: sent, each may land whatever becomes of the call.
        self._writing: dict[WriteId, Usage] = {}
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self._writer_id = secrets.token_hex(8)
        self._seqs = itertools.count(1)

    def record(
        self,
        user: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        input_cached_tokens: int = 0,
        *,
        arrived_s: float | None = None,
    ) -> bool:
        """One settled request's charged tokens (input_cached_tokens: of its input, those served
        from the prefix cache); False when it could not be queued. `arrived_s`: when the request
        came (its reply's `created`; None: now), whose UTC day the row is: a request that ran past
        midnight is counted on the day its client's reply says, not on the next."""
        key = (user, model, utc_day(arrived_s))
        if self._closed:
            return self._drop(key, input_tokens, output_tokens, input_cached_tokens, "closed")
        row = self._waiting.get(key)
        if row is None:
            if len(self._waiting) >= self._max_waiting:
                return self._drop(key, input_tokens, output_tokens, input_cached_tokens, "queue_full")
            self._waiting[key] = [input_tokens, output_tokens, 1, input_cached_tokens]
        else:
            row[0] += input_tokens
            row[1] += output_tokens
            row[2] += 1
            row[3] += input_cached_tokens
        self._idle.clear()
        self._wake.set()
        return True

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="usage-writer")

    async def flush(self) -> None:
        """Wait until everything recorded so far is in the store."""
        await self._idle.wait()

    async def written(self, user: str | None, timeout_s: float) -> bool:
        """Wait, at most `timeout_s`, until the rows of `user` (None: everyone) recorded so far are
        in the store (or given up on). False: the wait ran out first, and a read now may miss them."""
        batch = self._batch_of(user)
        if batch <= self._done:
            return True
        if timeout_s <= 0:
            # [keys] usage_read_wait_s = 0: reads never wait, so none cuts the gather short either
            # (a batch written per read, that nobody waited for).
            USAGE_READS_UNWRITTEN.inc()
            return False
        if batch > self._taken:  # still gathering: this read wants it now
            self._write_now.set()
        landed = self._landed.get(batch)
        if landed is None:
            landed = self._landed[batch] = asyncio.get_running_loop().create_future()
        # Shared by every read of that batch: a read that times out leaves it to the others.
        await asyncio.wait({landed}, timeout=timeout_s)
        if landed.done():
            return True
        USAGE_READS_UNWRITTEN.inc()
        log.warning("usage_read_before_written", user=user, waited_s=timeout_s)
        return False

    def _batch_of(self, user: str | None) -> int:
        """The batch that writes the last of `user`'s rows recorded so far (0: none left unwritten)."""
        if user is None:
            if self._waiting:
                return self._taken + 1
            return self._taken if self._batch else 0
        # Scanned here, on the read, so that `record` keeps no index per user.
        if any(key[0] == user for key in self._waiting):
            return self._taken + 1
        return self._taken if any(row.user == user for row in self._batch) else 0

    def _finished(self, batch: int) -> None:
        """Every batch up to `batch` is done with: the reads that waited for them go on."""
        self._done = max(self._done, batch)
        for n in [n for n in self._landed if n <= self._done]:
            landed = self._landed.pop(n)
            if not landed.done():
                landed.set_result(None)

    async def aclose(self) -> None:
        self._closed = True
        self._write_now.set()
        if self._worker is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self._drain_timeout_s)
        await stop_task(self._worker)
        self._worker = None
        waiting, self._waiting = self._waiting, {}
        unwritten = self._batch + _rows(waiting)
        self._batch = []
        writing, self._writing = self._writing, {}
        for write, row in writing.items():
            # Kept apart: summed with rows of its key that never went out, a replay under its
            # WriteId would be skipped whole if it had landed.
            unwritten.remove(row)
            USAGE_DROPPED.inc(row.requests)
            log.error(
                "usage_unwritten", **row.as_dict(), writer=write.writer, seq=write.seq, maybe_written=True
            )
        for row in _summed(unwritten):
            USAGE_DROPPED.inc(row.requests)
            log.error("usage_unwritten", **row.as_dict())
        # Nothing more will be written: a read waiting reads what is there.
        self._finished(self._taken + 1)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if not self._closed:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._gather_s):
                        await self._write_now.wait()
            self._wake.clear()
            if not self._closed:
                self._write_now.clear()
            waiting, self._waiting = self._waiting, {}
            self._taken += 1
            # What aclose logs as unwritten if it cancels these writes: each row leaves it once written.
            self._batch = rows = _rows(waiting)
            await self._write_all(rows)
            self._finished(self._taken)
            if not self._waiting:
                self._idle.set()

    async def _write_all(self, rows: list[Usage]) -> None:
        """Each row written, `store.parallel_writes` at a time; a row leaves `rows` once written."""
        pending = iter(list(rows))

        async def write_each() -> None:
            for row in pending:
                await self._write(row)
                rows.remove(row)

        async with asyncio.TaskGroup() as writers:
            for _ in range(min(self._store.parallel_writes, len(rows))):
                writers.create_task(write_each())

    async def _write(self, row: Usage) -> None:
        """Retries until the store takes it (dropping it would under-bill), or refuses it for good."""
        write = WriteId(self._writer_id, next(self._seqs))
        self._writing[write] = row
        attempt = 0
        while True:
            try:
                added = await self._store.add(row, write)
            except UsageRefused as exc:
                # Retried, it would fail the same way while every row queued behind it waited (and
                # then was dropped with the queue full): logged whole for billing's replay instead.
                del self._writing[write]
                USAGE_DROPPED.inc(row.requests)
                log.error("usage_unwritten", **row.as_dict(), refused=str(exc))
                return
            except Exception as exc:
                attempt += 1
                USAGE_WRITE_RETRIES.inc()
                backoff = min(self._max_backoff_s, self._base_backoff_s * 2 ** min(attempt, 16))
                log.warning("usage_write_failed", user=row.user, attempt=attempt, error=repr(exc))
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            else:
                del self._writing[write]
                if not added:  # an earlier try had landed; its answer was lost
                    USAGE_WRITES_REPEATED.inc()
                USAGE_ROWS_WRITTEN.inc()
                return

    def _drop(self, key: Key, input_tokens: int, output_tokens: int, cached: int, reason: str) -> bool:
        USAGE_DROPPED.inc()
        row = Usage(*key, input_tokens, output_tokens, 1, cached)
        log.warning("usage_dropped", reason=reason, **row.as_dict())
        return False


def _rows(waiting: dict[Key, list[int]]) -> list[Usage]:
    return [Usage(user, model, day, *counts) for (user, model, day), counts in waiting.items()]


def _summed(batch: list[Usage]) -> list[Usage]:
    sums: dict[Key, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for u in batch:
        s = sums[(u.user, u.model, u.day)]
        s[0] += u.input_tokens
        s[1] += u.output_tokens
        s[2] += u.requests
        s[3] += u.input_cached_tokens
    return [Usage(user, model, day, *counts) for (user, model, day), counts in sums.items()]
