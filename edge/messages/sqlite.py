"""The embedded message store: one SQLite file in WAL mode, queried off the event loop.

A message lives `ttl_s` ([messages] ttl_days), as DynamoDB's TTL keeps it there: past it, history
no longer returns it, and a sweep at most once an hour (on a write) deletes it from the file, a
batch of SWEEP_BATCH rows on each write until none is left."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio.to_thread

from edge.messages.conversation_lock import Taken
from edge.messages.message import StoredMessage
from edge.messages.store import DEFAULT_TTL_S, HistoryPage, Order, Span, reads, span
from edge.sqlite_file import add_columns, create_private

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    user TEXT NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    finish_reason TEXT,
    name TEXT,
    model TEXT,
    PRIMARY KEY (conversation_id, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS messages_by_age ON messages (created_at);
-- A history read finds the owner's messages of a conversation without stepping over others' of the
-- same id (clients choose ids: "default" may be everyone's): through the primary key alone, a read
-- of another user's id took as long as that conversation was, and said it existed.
CREATE INDEX IF NOT EXISTS messages_by_owner ON messages (conversation_id, user, message_id);
-- One request at a time per conversation (edge/messages/conversation_lock.py): a row per held one,
-- kept a moment once released (holder '') with the conversation's newest message id.
CREATE TABLE IF NOT EXISTS conversation_locks (
    user TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL,
    last_message_id TEXT,
    PRIMARY KEY (user, conversation_id)
) WITHOUT ROWID;
"""
_SWEEP_EVERY_S = 3600.0
# The most expired rows one write deletes. A sweep's DELETE holds the file's write lock until it
# ends: one statement for every expired row took 9 s for 300,000 rows (51 s for a million: an hour
# of a busy edge's turns, or a file whose ttl_days was lowered), and meanwhile every other worker's
# write failed "database is locked" past its 5 s wait, and this worker's history reads waited on
# the store's lock. A batch takes tens of milliseconds; the writes that follow delete the rest.
SWEEP_BATCH = 1_000
_SWEEP = (
    "DELETE FROM messages WHERE (conversation_id, message_id) IN"
    " (SELECT conversation_id, message_id FROM messages WHERE created_at <= ? LIMIT ?)"
)
# One statement, so atomic between the workers sharing the file: a new row, or a released or expired
# one taken over, its last_message_id read back; a lock held past `now` is left as it is (no row
# returned: refused).
_TAKE_LOCK = (
    "INSERT INTO conversation_locks (user, conversation_id, holder, expires_at) VALUES (?,?,?,?)"
    " ON CONFLICT (user, conversation_id) DO UPDATE SET holder = excluded.holder,"
    " expires_at = excluded.expires_at"
    " WHERE conversation_locks.holder = '' OR conversation_locks.expires_at <= ?"
    " RETURNING last_message_id"
)
_RELEASE_LOCK = (
    "UPDATE conversation_locks SET holder = '', expires_at = ?,"
    " last_message_id = coalesce(?, last_message_id)"
    " WHERE user = ? AND conversation_id = ? AND holder = ?"
)
# Locks of an edge that died holding them, and released ones past their ORDER_KEPT_S.
_SWEEP_LOCKS = "DELETE FROM conversation_locks WHERE expires_at <= ?"
_BUSY_WAIT_MS = 5_000  # sqlite3.connect's default
_SCHEMA_WAIT_MS = 600_000

_COLUMNS = (
    "conversation_id, user, message_id, role, content, request_id, created_at, finish_reason, name, model"
)


class SQLiteMessageStore:
    """Two connections, each shared by the worker threads and serialised by a lock of its own: one
    writes (SQLite allows one writer at a time anyway), the other reads the history. WAL lets a
    reader read beside a writer, but not on the writer's connection: with one connection, a history
    read waited behind each write queued before it, and a write waits out the 5 s busy wait while
    another connection (an edge worker, `floodgate keys`, a `sqlite3` shell) holds the file's write
    lock, so a reload of a stored conversation took 5 to 16 s."""

    def __init__(self, path: str | Path, *, ttl_s: float = DEFAULT_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._swept_at = 0.0
        # The last sweep's batch was full: expired rows may be left, for the next write's batch.
        self._sweep_left = False
        create_private(path)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        # The first start on a file of the release before builds messages_by_owner over every row
        # (6.3 s for 8M rows): a second worker opening it meanwhile waited out the 5 s default and
        # failed ("database is locked"). The schema step waits as long as the build may take.
        self._conn.execute(f"PRAGMA busy_timeout = {_SCHEMA_WAIT_MS}")
        self._conn.executescript(_SCHEMA)
        # `name` came with the turns' speakers, `model` with the replies' models: an older file's
        # rows read None for them.
        add_columns(self._conn, "messages", ("name", "model"))
        # Released locks keep the conversation's newest message id (edge/messages/conversation_lock.py).
        add_columns(self._conn, "conversation_locks", ("last_message_id",))
        self._conn.execute(f"PRAGMA busy_timeout = {_BUSY_WAIT_MS}")
        # Opened once the schema is there. It waits only where a reader must (a checkpoint
        # resetting the WAL, or a file not yet in WAL mode), never on another connection's writes.
        self._reader = sqlite3.connect(
            str(path), check_same_thread=False, isolation_level=None, timeout=_BUSY_WAIT_MS / 1000
        )
        self._read_lock = threading.Lock()

    async def append(self, msg: StoredMessage) -> None:
        await anyio.to_thread.run_sync(self._append, msg)

    async def history(
        self,
        conversation_id: str,
        user: str,
        limit: int = 100,
        *,
        after: str | None = None,
        before: str | None = None,
        order: Order = "asc",
    ) -> HistoryPage:
        where = span(after, before, order)
        if where.empty:
            return HistoryPage([], has_more=False)
        rows = await anyio.to_thread.run_sync(self._history, conversation_id, user, limit, where)
        return where.page(rows, limit)

    # The conversation locks' three steps (edge/messages/conversation_lock.py), each one statement:
    # blocking, run on the locks' own worker threads.
    def take_lock(
        self, user: str, conversation_id: str, holder: str, now: float, expires_at: float
    ) -> Taken | None:
        with self._lock:
            # Read to its end: a RETURNING statement holds the file's write lock until then.
            rows = self._conn.execute(_TAKE_LOCK, (user, conversation_id, holder, expires_at, now)).fetchall()
        return Taken(rows[0][0]) if rows else None

    def renew_lock(self, user: str, conversation_id: str, holder: str, expires_at: float) -> bool:
        sql = (
            "UPDATE conversation_locks SET expires_at = ?"
            " WHERE user = ? AND conversation_id = ? AND holder = ?"
        )
        return self._write(sql, (expires_at, user, conversation_id, holder))

    def release_lock(
        self, user: str, conversation_id: str, holder: str, kept_until: float, last_message_id: str | None
    ) -> None:
        self._write(_RELEASE_LOCK, (kept_until, last_message_id, user, conversation_id, holder))

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._close)

    def _write(self, sql: str, args: tuple[object, ...]) -> bool:
        """One statement; whether it changed a row."""
        with self._lock:
            return self._conn.execute(sql, args).rowcount > 0

    def _append(self, msg: StoredMessage) -> None:
        row = (
            msg.conversation_id,
            msg.user,
            msg.message_id,
            msg.role,
            msg.content,
            msg.request_id,
            msg.created_at,
            msg.finish_reason,
            msg.name,
            msg.model,
        )
        now = time.time()
        with self._lock:
            # REPLACE makes a retried write after an ambiguous failure harmless.
            self._conn.execute(
                f"INSERT OR REPLACE INTO messages ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", row
            )
            if self._sweep_left or now - self._swept_at >= _SWEEP_EVERY_S:
                self._swept_at = now
                swept = self._conn.execute(_SWEEP, (now - self._ttl_s, SWEEP_BATCH)).rowcount
                self._sweep_left = swept == SWEEP_BATCH
                self._conn.execute(_SWEEP_LOCKS, (now,))

    def _history(self, conversation_id: str, user: str, limit: int, where: Span) -> list[StoredMessage]:
        # The cursors bound message_id, the primary key's second column: a range of the index, so
        # a page deep into a long conversation costs what the first one does.
        # Named: the planner takes the primary key (conversation_id, message_id) for its order,
        # and steps over every user's messages of the id on the way.
        sql = f"SELECT {_COLUMNS} FROM messages INDEXED BY messages_by_owner WHERE conversation_id = ?"
        args: list[object] = [conversation_id]
        if where.above is not None:
            sql += " AND message_id > ?"
            args.append(where.above)
        if where.below is not None:
            sql += " AND message_id < ?"
            args.append(where.below)
        direction = "ASC" if where.ascending else "DESC"
        sql += f" AND user = ? AND created_at > ? ORDER BY message_id {direction} LIMIT ?"
        args += [user, time.time() - self._ttl_s, limit + 1]
        with self._read_lock:
            rows = self._reader.execute(sql, args)
            try:
                # Row by row: those past the page's text budget are never read (store.reads).
                return reads((_message(row) for row in rows), limit)
            finally:
                rows.close()  # its statement ends here, not when the cursor is collected

    def _close(self) -> None:
        with self._read_lock:
            self._reader.close()
        with self._lock:
            self._conn.close()


def _message(row: tuple[Any, ...]) -> StoredMessage:
    conversation_id, user, message_id, role, content, request_id, created_at, finish_reason, name, model = row
    return StoredMessage(
        conversation_id,
        user,
        message_id,
        role,
        content,
        request_id,
        created_at,
        finish_reason,
        name=name,
        model=model,
    )
