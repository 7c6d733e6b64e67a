"""Usage rows in the embedded store's SQLite file (beside the keys), added to in place.

Each writer's last applied seq sits in `usage_writes`, changed in the same transaction as the row,
so a write repeated after an error adds nothing (edge/usage/store.py: WriteId), as in DynamoDB.

A writer is one process start (each edge worker's), and its row outlived it: `usage_writes` grew by
a row per start for as long as the file lived. A writer's row is kept WRITER_KEPT_S past its last
write, long enough for any retry of its own and for a replay of what its close logged
(`usage_unwritten` with `maybe_written`, edge/usage/writer.py); a sweep at most once an hour (on a
write) deletes those older. A writer still running that writes again past it starts a row anew:
its seqs only rise, so none of its writes already landed can be taken for a new one."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import anyio.to_thread

from edge.keys.sqlite import connect
from edge.sqlite_file import add_columns
from edge.usage.page import Position, UsagePage, page_of
from edge.usage.record import Usage
from edge.usage.store import WriteId

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    user TEXT NOT NULL,
    day TEXT NOT NULL,
    model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    input_cached_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user, day, model)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage_writes (
    writer TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    written_at REAL
) WITHOUT ROWID;
"""
# A row's columns in Usage's field order, so that Usage(*row) reads one.
_COLUMNS = "user, model, day, input_tokens, output_tokens, requests, input_cached_tokens"
WRITER_KEPT_S = 30 * 86400
_SWEEP_EVERY_S = 3600.0


class SQLiteUsageStore:
    """Two connections, each serialised by a lock of its own: one writes, the other reads. WAL lets
    a reader read beside a writer, but not on the writer's connection: with one connection a usage
    read waited behind this edge's write, which waits out the 10 s busy wait while another
    connection (an edge worker, `floodgate keys`, a `sqlite3` shell) holds the file's write lock."""

    parallel_writes = 1  # one seq per writer (usage_writes), and one connection besides

    def __init__(self, path: str | Path) -> None:
        self._conn = connect(path)
        self._lock = threading.Lock()
        self._reader = connect(path)
        self._read_lock = threading.Lock()
        self._swept_at = 0.0
        self._conn.executescript(_SCHEMA)
        add_columns(self._conn, "usage_writes", ("written_at",), kind="REAL")
        # A file an older edge made has no cached count: its rows read 0 (none was recorded).
        add_columns(self._conn, "usage", ("input_cached_tokens",), kind="INTEGER NOT NULL DEFAULT 0")
        # Writers of a release that kept no time: from now, they are kept as long as any.
        self._conn.execute("UPDATE usage_writes SET written_at = ? WHERE written_at IS NULL", (time.time(),))

    async def add(self, usage: Usage, write: WriteId) -> bool:
        return await anyio.to_thread.run_sync(self._add, usage, write)

    async def query(self, user: str | None = None, start: str = "", end: str = "") -> list[Usage]:
        return await anyio.to_thread.run_sync(self._query, user, start, end)

    async def page(
        self, user: str | None, start: str, end: str, after: Position | None, limit: int
    ) -> UsagePage:
        found = await anyio.to_thread.run_sync(self._page, user, start, end, after, limit + 1)
        return page_of(found, limit)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._close)

    def _add(self, u: Usage, write: WriteId) -> bool:
        with self._lock:
            # The connection is in autocommit mode (edge/keys/sqlite.py): the row and the writer's
            # seq go in one explicit transaction, or neither does.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                added = self._add_once(u, write)
                # Inside the guard too: a COMMIT that fails (a full disk, an I/O error) leaves the
                # transaction open, and every later BEGIN on this connection failed ("cannot start
                # a transaction within a transaction"): no usage was written again until a restart.
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            return added

    def _add_once(self, u: Usage, write: WriteId) -> bool:
        now = time.time()
        seq_moved = self._conn.execute(
            "INSERT INTO usage_writes (writer, seq, written_at) VALUES (?, ?, ?) ON CONFLICT (writer) "
            "DO UPDATE SET seq = excluded.seq, written_at = excluded.written_at WHERE excluded.seq > seq",
            (write.writer, write.seq, now),
        )
        if seq_moved.rowcount == 0:
            return False
        if now - self._swept_at >= _SWEEP_EVERY_S:
            self._swept_at = now
            self._conn.execute("DELETE FROM usage_writes WHERE written_at <= ?", (now - WRITER_KEPT_S,))
        self._conn.execute(
            f"INSERT INTO usage ({_COLUMNS}) VALUES (?,?,?,?,?,?,?) "
            "ON CONFLICT (user, day, model) DO UPDATE SET "
            "input_tokens = input_tokens + excluded.input_tokens, "
            "output_tokens = output_tokens + excluded.output_tokens, "
            "requests = requests + excluded.requests, "
            "input_cached_tokens = input_cached_tokens + excluded.input_cached_tokens",
            (u.user, u.model, u.day, u.input_tokens, u.output_tokens, u.requests, u.input_cached_tokens),
        )
        return True

    def _query(self, user: str | None, start: str, end: str) -> list[Usage]:
        where, params = _range(user, start, end)
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT {_COLUMNS} FROM usage WHERE {' AND '.join(where)} ORDER BY user, day, model",
                params,
            ).fetchall()
        return [Usage(*row) for row in rows]

    def _page(self, user: str | None, start: str, end: str, after: Position | None, want: int) -> list[Usage]:
        # Keyset on the primary key (user, day, model): the page starts past the cursor's row.
        where, params = _range(user, start, end)
        if after is not None:
            where.append("(user, day, model) > (?, ?, ?)")
            params.extend(after)
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT {_COLUMNS} FROM usage WHERE {' AND '.join(where)} ORDER BY user, day, model LIMIT ?",
                (*params, want),
            ).fetchall()
        return [Usage(*row) for row in rows]

    def _close(self) -> None:
        with self._read_lock:
            self._reader.close()
        with self._lock:
            self._conn.close()


def _range(user: str | None, start: str, end: str) -> tuple[list[str], list[str]]:
    """The WHERE terms and their parameters of a read's days (and user, where one is asked)."""
    where, params = ["day >= ?"], [start]
    if end:
        where.append("day <= ?")
        params.append(end)
    if user is not None:
        where.append("user = ?")
        params.append(user)
    return where, params
